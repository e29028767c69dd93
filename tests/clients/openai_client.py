"""Drives `bmoe serve` with the official `openai` Python package, as the
clients people point at a local server do. Run by tests/serve.rs with the
server's base URL; exits non-zero naming the first check that failed."""

import json
import sys
import threading

from openai import OpenAI

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 12}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
]


def check(ok, what):
    if not ok:
        print(f"FAILED: {what}", file=sys.stderr)
        sys.exit(1)


def main(base_url):
    client = OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=600)

    models = client.models.list()
    ids = [m.id for m in models.data]
    check(len(ids) == 1, f"one model listed, got {ids}")
    model = ids[0]
    retrieved = client.models.retrieve(model)
    check(retrieved.id == model, f"models.retrieve gave {retrieved.id}")

    # Log-probabilities, whole and streamed: the same values, bit for bit
    # (JSON carries each float's shortest exact form).
    ask_lp = [{"role": "user", "content": "Name a colour"}]
    lp = client.chat.completions.create(
        model=model, messages=ask_lp, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3
    )
    entries = lp.choices[0].logprobs.content
    check(len(entries) == lp.usage.completion_tokens, f"{len(entries)} logprobs for {lp.usage.completion_tokens} tokens")
    for e in entries:
        check(e.logprob <= 0 and len(e.top_logprobs) == 3, f"logprob entry {e}")
        # Greedy: the chosen token is the most likely one.
        check(e.top_logprobs[0].logprob == e.logprob, f"greedy token is not the top one: {e}")
        check(all(a.logprob >= b.logprob for a, b in zip(e.top_logprobs, e.top_logprobs[1:])), "top order")
    spelled = "".join(e.token for e in entries)
    check((lp.choices[0].message.content or "").strip() in spelled, f"tokens {spelled!r} do not spell the answer")
    streamed_lp = []
    for chunk in client.chat.completions.create(
        model=model, messages=ask_lp, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3, stream=True
    ):
        for c in chunk.choices:
            if c.logprobs and c.logprobs.content:
                streamed_lp.extend(c.logprobs.content)
    check(
        [(e.token, e.logprob) for e in streamed_lp] == [(e.token, e.logprob) for e in entries],
        "streamed logprobs differ from the whole reply's",
    )
    done = client.completions.create(model=model, prompt="Once upon", max_tokens=4, temperature=0, logprobs=2)
    lps = done.choices[0].logprobs
    check(len(lps.tokens) == len(lps.token_logprobs) == len(lps.top_logprobs) == 4, f"completion logprobs {lps}")
    check(lps.text_offset[0] == 0 and "".join(lps.tokens) == done.choices[0].text, f"offsets {lps.text_offset}")

    # A list of prompts: one choice each, in order, each its prompt alone.
    many = client.completions.create(model=model, prompt=["Once upon", "Seven"], max_tokens=4, temperature=0)
    check([c.index for c in many.choices] == [0, 1], f"choices {many.choices}")
    check(many.choices[0].text == done.choices[0].text, "a listed prompt differs from it alone")
    seven = client.completions.create(model=model, prompt="Seven", max_tokens=4, temperature=0)
    check(many.choices[1].text == seven.choices[0].text, "the second listed prompt differs from it alone")

    hello = [{"role": "user", "content": "Say hello"}]
    whole = client.chat.completions.create(model=model, messages=hello, max_tokens=8, temperature=0)
    check(whole.object == "chat.completion", f"object {whole.object}")
    choice = whole.choices[0]
    check(choice.message.role == "assistant", f"role {choice.message.role}")
    check(choice.finish_reason in ("stop", "length"), f"finish_reason {choice.finish_reason}")
    check(whole.usage.completion_tokens <= 8, f"usage {whole.usage}")
    check(whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens, "usage sums")

    stream = client.chat.completions.create(
        model=model, messages=hello, max_tokens=8, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    text, finish, usage = "", None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    check(text == (choice.message.content or ""), f"streamed {text!r} against whole {choice.message.content!r}")
    check(finish == choice.finish_reason, f"streamed finish {finish}")
    check(usage is not None and usage.completion_tokens == whole.usage.completion_tokens, f"streamed usage {usage}")

    # A tool call, answered and continued: the history goes back as the
    # client holds it (arguments as JSON text, content None).
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    called = client.chat.completions.create(
        model=model, messages=ask, tools=TOOLS, tool_choice="required", max_tokens=400, temperature=0
    )
    msg = called.choices[0].message
    check(called.choices[0].finish_reason == "tool_calls", f"finish {called.choices[0].finish_reason}")
    check(msg.tool_calls and msg.tool_calls[0].function.name == "get_weather", f"tool calls {msg.tool_calls}")
    arguments = json.loads(msg.tool_calls[0].function.arguments)
    check(isinstance(arguments.get("city"), str), f"arguments {arguments}")
    history = ask + [
        {
            "role": "assistant",
            "content": msg.content,
            "tool_calls": [
                {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
                for c in msg.tool_calls
            ],
        },
        {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "18 C and sunny"},
    ]
    after = client.chat.completions.create(model=model, messages=history, tools=TOOLS, max_tokens=8, temperature=0)
    check(after.choices[0].message.role == "assistant", "a reply after the tool result")
    check(after.usage.prompt_tokens > called.usage.prompt_tokens, "the tool result is in the prompt")

    # Structured output that parses and follows the schema.
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 10}, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    shaped = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "A person as JSON"}],
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}},
        max_tokens=400,
        temperature=0,
    )
    person = json.loads(shaped.choices[0].message.content)
    check(set(person) == {"name", "age"} and 0 <= person["age"] <= 120, f"schema output {person}")

    # Four streamed chats at once, from threads.
    results, errors = {}, []

    def chat(i):
        try:
            s = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": f"Count to {i}"}], max_tokens=6, temperature=0, stream=True
            )
            results[i] = "".join(c.choices[0].delta.content or "" for c in s if c.choices)
        except Exception as e:  # reported below
            errors.append(f"{i}: {e!r}")

    threads = [threading.Thread(target=chat, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(not errors, f"concurrent chats failed: {errors}")
    check(sorted(results) == [0, 1, 2, 3], f"concurrent results {results}")
    # Each equals the same request alone.
    for i, text in results.items():
        alone = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": f"Count to {i}"}], max_tokens=6, temperature=0
        )
        check(alone.choices[0].message.content == text, f"chat {i}: concurrent {text!r} against alone")
    print("openai client: all checks passed")


if __name__ == "__main__":
    main(sys.argv[1])
