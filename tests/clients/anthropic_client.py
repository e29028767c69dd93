"""Drives `bmoe serve`'s Messages API with the official `anthropic` Python
package, as Claude Code and other Anthropic clients do. Run by
tests/serve_apis.rs with the server's base URL and API key; the server runs
a template that opens a thinking block (qwen3.5). Exits non-zero naming the
first check that failed."""

import sys

import anthropic

WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
OFF = {"type": "disabled"}


def check(ok, what):
    if not ok:
        print(f"FAILED: {what}", file=sys.stderr)
        sys.exit(1)


def text_of(message):
    return "".join(b.text for b in message.content if b.type == "text")


def main(base_url, key):
    client = anthropic.Anthropic(base_url=base_url, api_key=key, max_retries=0, timeout=600)
    listed = client.models.list()
    check(len(listed.data) == 1 and listed.data[0].type == "model", f"models {listed}")
    model = listed.data[0].id
    ask = [{"role": "user", "content": "Name a colour"}]

    # Whole: a text block, the stop reason, usage that count_tokens agrees with.
    whole = client.messages.create(model=model, max_tokens=8, messages=ask, temperature=0, thinking=OFF)
    check(whole.type == "message" and whole.role == "assistant", f"message {whole}")
    check([b.type for b in whole.content] == ["text"], f"content blocks {whole.content}")
    check(whole.stop_reason in ("end_turn", "max_tokens"), f"stop_reason {whole.stop_reason}")
    counted = client.messages.count_tokens(model=model, messages=ask, thinking=OFF)
    check(counted.input_tokens == whole.usage.input_tokens > 0, f"count_tokens {counted} usage {whole.usage}")
    check(whole.usage.output_tokens > 0, f"usage {whole.usage}")

    # Streamed: the same text, through the SDK's event accumulator.
    with client.messages.stream(model=model, max_tokens=8, messages=ask, temperature=0, thinking=OFF) as stream:
        pieces = [t for t in stream.text_stream]
        streamed = stream.get_final_message()
    check("".join(pieces) == text_of(streamed) == text_of(whole), f"streamed {pieces!r} vs whole {text_of(whole)!r}")
    check(streamed.stop_reason == whole.stop_reason, f"streamed stop_reason {streamed.stop_reason}")
    check(streamed.usage.output_tokens == whole.usage.output_tokens, f"streamed usage {streamed.usage}")

    # A stop sequence from the middle of the greedy reply ends it there.
    answer = text_of(whole)
    if len(answer.strip()) >= 4:
        cut = answer.strip()[2:4]
        stopped = client.messages.create(
            model=model, max_tokens=8, messages=ask, temperature=0, thinking=OFF, stop_sequences=[cut]
        )
        check(stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == cut, f"stopped {stopped}")
        check(cut not in text_of(stopped), f"the stop sequence {cut!r} is in {text_of(stopped)!r}")

    # Thinking on: the template opens a thinking block, sent as one.
    thought = client.messages.create(
        model=model,
        max_tokens=6,
        messages=ask,
        temperature=0,
        thinking={"type": "enabled", "budget_tokens": 1024},
    )
    check(thought.content[0].type == "thinking" and thought.content[0].thinking, f"thinking on: {thought.content}")
    with client.messages.stream(
        model=model, max_tokens=6, messages=ask, temperature=0, thinking={"type": "enabled", "budget_tokens": 1024}
    ) as stream:
        kinds = [e.type for e in stream]
        thought_streamed = stream.get_final_message()
    check("thinking" in kinds, f"no thinking events in {kinds}")
    check(thought_streamed.content[0].thinking == thought.content[0].thinking, "streamed thinking differs")

    # A streamed two-turn tool loop: the call, then the reply to its result
    # (with the first turn's thinking block in the history).
    tools = [WEATHER]
    turn = ask + []
    with client.messages.stream(
        model=model,
        max_tokens=200,
        messages=turn,
        temperature=0,
        tools=tools,
        tool_choice={"type": "any"},
        thinking=OFF,
    ) as stream:
        events = [e.type for e in stream]
        called = stream.get_final_message()
    check(called.stop_reason == "tool_use", f"stop_reason {called.stop_reason}: {called.content}")
    uses = [b for b in called.content if b.type == "tool_use"]
    check(len(uses) >= 1 and uses[0].name == "get_weather", f"tool uses {called.content}")
    check(isinstance(uses[0].input, dict) and isinstance(uses[0].input.get("city"), str), f"input {uses[0].input}")
    check("input_json" in events, f"no input_json events in {events}")
    history = turn + [
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "Look it up.", "signature": ""}] + [b.model_dump() for b in called.content]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": u.id, "content": [{"type": "text", "text": "Sunny, 21 C"}]}
                for u in uses
            ],
        },
    ]
    with client.messages.stream(
        model=model, max_tokens=8, messages=history, temperature=0, tools=tools, thinking=OFF
    ) as stream:
        replied = stream.get_final_message()
    check(replied.stop_reason in ("end_turn", "max_tokens", "tool_use"), f"second turn {replied}")
    check(replied.usage.input_tokens > called.usage.input_tokens, "the second turn's prompt is not longer")

    # Errors in Anthropic's shape, as the SDK's exceptions.
    try:
        client.messages.create(model=model, max_tokens=8, messages=ask, temperature=1.5)
        check(False, "temperature 1.5 was taken")
    except anthropic.BadRequestError as e:
        check(e.body["error"]["type"] == "invalid_request_error" and "temperature" in e.message, f"error {e.body}")
    wrong = anthropic.Anthropic(base_url=base_url, api_key="wrong", max_retries=0)
    try:
        wrong.messages.create(model=model, max_tokens=8, messages=ask)
        check(False, "a wrong key was taken")
    except anthropic.AuthenticationError as e:
        check(e.body["error"]["type"] == "authentication_error", f"error {e.body}")
    print("ok")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
