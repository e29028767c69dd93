"""Drives `bmoe serve`'s Responses API with the official `openai` Python
package's `client.responses`, as Codex and newer OpenAI SDK code do. Run by
tests/serve_apis.rs with the server's base URL; the server runs a template
that opens a thinking block (qwen3.5). Exits non-zero naming the first check
that failed."""

import json
import sys

import openai
from openai import OpenAI

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
OFF = {"effort": "none"}


def check(ok, what):
    if not ok:
        print(f"FAILED: {what}", file=sys.stderr)
        sys.exit(1)


def main(base_url):
    client = OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=600)
    model = client.models.list().data[0].id

    # Whole, with text input and instructions.
    whole = client.responses.create(
        model=model, input="Name a colour", instructions="Be brief.", max_output_tokens=8, temperature=0, reasoning=OFF
    )
    check(whole.object == "response" and whole.status in ("completed", "incomplete"), f"response {whole}")
    check([i.type for i in whole.output] == ["message"], f"output items {whole.output}")
    check(whole.output_text == whole.output[0].content[0].text, "output_text")
    check(whole.usage.input_tokens > 0 and whole.usage.output_tokens > 0, f"usage {whole.usage}")
    if whole.status == "incomplete":
        check(whole.incomplete_details.reason == "max_output_tokens", f"incomplete {whole.incomplete_details}")

    # Streamed: the same text, and the event sequence. A reply cut by
    # max_output_tokens ends with `response.incomplete`, as the API's does
    # (the SDK's stream helper waits for `response.completed` only), so the
    # raw events are read here.
    deltas, kinds = [], []
    for event in client.responses.create(
        model=model,
        input="Name a colour",
        instructions="Be brief.",
        max_output_tokens=8,
        temperature=0,
        reasoning=OFF,
        stream=True,
    ):
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        final = getattr(event, "response", None)
    check(kinds[0] == "response.created" and kinds[-1] == f"response.{whole.status}", f"events {kinds}")
    check(final.status == whole.status and final.output_text == whole.output_text, f"final {final}")
    check("".join(deltas) == whole.output_text, f"streamed {deltas!r} vs {whole.output_text!r}")

    # Reasoning on: a reasoning item with the thinking as its summary.
    thought = client.responses.create(
        model=model, input="Name a colour", max_output_tokens=6, temperature=0, reasoning={"effort": "high", "summary": "auto"}
    )
    check(thought.output[0].type == "reasoning" and thought.output[0].summary[0].text, f"reasoning: {thought.output}")

    # A streamed two-turn tool loop, as items: the call, its output, the reply.
    items = [{"role": "user", "content": "What is the weather in Oslo?"}]
    args, kinds = [], []
    with client.responses.stream(
        model=model,
        input=items,
        tools=[WEATHER],
        tool_choice="required",
        max_output_tokens=200,
        temperature=0,
        reasoning=OFF,
    ) as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "response.function_call_arguments.delta":
                args.append(event.delta)
        called = stream.get_final_response()
    calls = [i for i in called.output if i.type == "function_call"]
    check(len(calls) >= 1 and calls[0].name == "get_weather", f"calls {called.output}")
    check(isinstance(json.loads(calls[0].arguments).get("city"), str), f"arguments {calls[0].arguments}")
    check("".join(args) == calls[0].arguments, f"streamed arguments {args!r}")
    check("response.output_item.added" in kinds and "response.function_call_arguments.done" in kinds, f"events {kinds}")
    history = items + [c.model_dump(exclude_none=True) for c in called.output] + [
        {"type": "function_call_output", "call_id": c.call_id, "output": "Sunny, 21 C"} for c in calls
    ]
    for event in client.responses.create(
        model=model, input=history, tools=[WEATHER], max_output_tokens=8, temperature=0, reasoning=OFF, stream=True
    ):
        replied = getattr(event, "response", None)
    check(replied.status in ("completed", "incomplete"), f"second turn {replied}")
    check(replied.usage.input_tokens > called.usage.input_tokens, "the second turn's prompt is not longer")

    # Structured output: text.format json_schema.
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["n"],
        "additionalProperties": False,
    }
    shaped = client.responses.create(
        model=model,
        input="A number",
        max_output_tokens=200,
        temperature=0,
        reasoning=OFF,
        text={"format": {"type": "json_schema", "name": "n", "schema": schema, "strict": True}},
    )
    check(shaped.status == "completed", f"the constrained reply did not end: {shaped}")
    check(0 <= json.loads(shaped.output_text)["n"] <= 99, f"json_schema output {shaped.output_text!r}")

    # What a stateless server cannot do is a 400 naming the field.
    try:
        client.responses.create(model=model, input="x", previous_response_id="resp_1")
        check(False, "previous_response_id was taken")
    except openai.BadRequestError as e:
        check(e.body["param"] == "previous_response_id", f"error {e.body}")
    print("ok")


if __name__ == "__main__":
    main(sys.argv[1])
