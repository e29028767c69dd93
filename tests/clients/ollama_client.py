"""Drives `bmoe serve`'s Ollama API with the official `ollama` Python
package, as Open WebUI, Continue and editor plugins speak it. Run by
tests/serve_apis.rs with the server's base URL; the server runs a template
that opens a thinking block (qwen3.5). Exits non-zero naming the first check
that failed."""

import json
import sys

import ollama

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            # (the package keeps a property's type, description and enum
            # only: an enum bounds what a random model writes)
            "properties": {"city": {"type": "string", "enum": ["Oslo", "Lima", "Pune"]}},
            "required": ["city"],
        },
    },
}
GREEDY = {"temperature": 0, "num_predict": 8}


def check(ok, what):
    if not ok:
        print(f"FAILED: {what}", file=sys.stderr)
        sys.exit(1)


def main(base_url):
    client = ollama.Client(host=base_url, timeout=600)

    # The listings.
    tags = client.list()
    check(len(tags.models) == 1, f"tags {tags}")
    model = tags.models[0].model
    check(tags.models[0].details.format == "gguf" and tags.models[0].size > 0, f"tag {tags.models[0]}")
    shown = client.show(model)
    check("completion" in shown.capabilities and "tools" in shown.capabilities, f"capabilities {shown.capabilities}")
    check(any(k.endswith(".context_length") for k in shown.modelinfo), f"model_info {shown.modelinfo}")
    running = client.ps()
    check(running.models[0].model == model, f"ps {running}")

    # Whole and streamed chat: the same text; keep_alive is taken.
    ask = [{"role": "user", "content": "Name a colour"}]
    whole = client.chat(model=model, messages=ask, options=GREEDY, think=False, keep_alive="5m")
    check(whole.done and whole.done_reason in ("stop", "length"), f"chat {whole}")
    check(whole.eval_count > 0 and whole.prompt_eval_count > 0, f"counts {whole}")
    parts = list(client.chat(model=model, messages=ask, options=GREEDY, think=False, stream=True))
    check(all(not p.done for p in parts[:-1]) and parts[-1].done, "one done line, last")
    check("".join(p.message.content for p in parts) == whole.message.content, "streamed chat differs from whole")

    # generate, whole and streamed, and with a system prompt.
    gen = client.generate(model=model, prompt="Name a colour", options=GREEDY, think=False)
    check(gen.done and gen.response == whole.message.content, f"generate {gen.response!r} vs chat {whole.message.content!r}")
    streamed = "".join(p.response for p in client.generate(model=model, prompt="Name a colour", options=GREEDY, think=False, stream=True))
    check(streamed == gen.response, "streamed generate differs")
    raw = client.generate(model=model, prompt="Once upon a time", raw=True, options=GREEDY)
    check(raw.done and raw.eval_count > 0, f"raw generate {raw}")

    # Thinking on: the template opens a thinking block.
    thought = client.chat(model=model, messages=ask, options={"temperature": 0, "num_predict": 6}, think=True)
    check(bool(thought.message.thinking), f"thinking on: {thought.message}")

    # A streamed two-turn tool loop. Ollama's API has no tool_choice: the
    # server runs with `--tool-choice required`, so a reply to the user is
    # a call. The call comes back as tool_calls in the stream.
    turn = [{"role": "user", "content": "What is the weather in Oslo?"}]
    calls = []
    for part in client.chat(model=model, messages=turn, tools=[WEATHER], options={"temperature": 0, "num_predict": 200}, think=False, stream=True):
        calls.extend(part.message.tool_calls or [])
    check(len(calls) >= 1 and calls[0].function.name == "get_weather", f"calls {calls}")
    check(calls[0].function.arguments.get("city") in ("Oslo", "Lima", "Pune"), f"arguments {calls[0].function.arguments}")
    history = turn + [
        {"role": "assistant", "content": "", "tool_calls": [c.model_dump(exclude_none=True) for c in calls]},
    ] + [{"role": "tool", "content": "Sunny, 21 C", "tool_name": c.function.name} for c in calls]
    parts = list(client.chat(model=model, messages=history, tools=[WEATHER], options=GREEDY, think=False, stream=True))
    check(parts[-1].done and parts[-1].prompt_eval_count > 0, f"second turn {parts[-1]}")

    # format: a JSON schema.
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["n"],
        "additionalProperties": False,
    }
    shaped = client.chat(
        model=model,
        messages=[{"role": "user", "content": "A number"}],
        format=schema,
        options={"temperature": 0, "num_predict": 200},
        think=False,
    )
    check(shaped.done_reason == "stop", f"the constrained reply did not end: {shaped}")
    check(0 <= json.loads(shaped.message.content)["n"] <= 99, f"format output {shaped.message.content!r}")

    # An option bmoe does not have is an error naming it.
    try:
        client.chat(model=model, messages=ask, options={"mirostat": 2})
        check(False, "mirostat was taken")
    except ollama.ResponseError as e:
        check(e.status_code == 400 and "mirostat" in e.error, f"error {e.status_code} {e.error}")
    print("ok")


if __name__ == "__main__":
    main(sys.argv[1])
