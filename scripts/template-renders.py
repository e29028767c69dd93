"""Renders every chat template in tests/data/chat-templates/ with Hugging Face
transformers (its own `render_jinja_template`, the code `apply_chat_template`
runs) and writes what it rendered to tests/data/template-renders/: the
expected outputs tests/chat_templates.rs compares bmoe's renders with, byte
for byte.

Each template is rendered for each conversation of CONVERSATIONS and each
thinking setting the template reads (SETTINGS: bmoe's setting, and the
keyword arguments that mean the same to that template, read from the
template's source by hand). Run it with scripts/template-renders.sh, which
makes the virtual environment with the pinned versions.

With `--templates DIR --out DIR --bmoe BIN` (scripts/template-check.sh), it
renders any folder of templates instead, each with thinking on and off as
`BIN template FILE --variables` says bmoe sets the template's switches.

Where transformers fails on the conversation as an OpenAI client sends it,
the expected render is transformers' render of the form the template takes
(tool-call arguments as JSON text instead of a mapping, an empty string
instead of a null content), and the case says so in `given`; where every form
fails, the case holds transformers' error.
"""

import argparse
import copy
import datetime
import json
import pathlib
import subprocess
import sys

import jinja2
import transformers
from transformers.utils import chat_template_utils

ROOT = pathlib.Path(__file__).resolve().parent.parent
TEMPLATES = ROOT / "tests" / "data" / "chat-templates"
OUT = ROOT / "tests" / "data" / "template-renders"

# strftime_now reports this moment in both renderers.
NOW = datetime.datetime(2026, 3, 14, 15, 9, 26)


class FixedClock(datetime.datetime):
    """A datetime whose now() is NOW."""

    @classmethod
    def now(cls, tz=None):
        return NOW


chat_template_utils.datetime = FixedClock

# What a template that refuses a conversation raises.
FAILURES = (jinja2.TemplateError, TypeError, ValueError, KeyError, AttributeError)

BOS = "<BOS>"
EOS = "<EOS>"

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city now.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "The city's name."},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    }
]


def call(call_id, city):
    """A tool call as an OpenAI client sends it (arguments as a mapping)."""
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": city, "unit": "celsius"}},
    }


def text_call(call_id, city):
    """A tool call with its arguments as JSON text, as the OpenAI API writes them."""
    c = call(call_id, city)
    c["function"]["arguments"] = json.dumps(c["function"]["arguments"], separators=(",", ":"))
    return c


def result(call_id, text):
    return {"role": "tool", "tool_call_id": call_id, "name": "get_weather", "content": text}


QUESTION = {"role": "user", "content": "What is the weather in Paris?"}

# Each: the messages, whether tools are offered, whether the render ends with
# the assistant's turn opened.
CONVERSATIONS = {
    "chat": {
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Hi there"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "Name a colour."},
        ],
    },
    "first_turn": {"messages": [{"role": "user", "content": "Hi there"}]},
    "history_ends_with_reply": {
        "messages": [
            {"role": "user", "content": "Hi there"},
            {"role": "assistant", "content": "Hello."},
        ],
        "add_generation_prompt": False,
    },
    "reasoning_in_history": {
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "reasoning_content": "Two and two make four.", "content": "4"},
            {"role": "user", "content": "And 3+3?"},
        ],
    },
    "tool_call": {
        "tools": True,
        "messages": [QUESTION, {"role": "assistant", "content": None, "tool_calls": [call("call_1", "Paris")]},
                     result("call_1", "18 C, sunny")],
    },
    "tool_call_arguments_as_text": {
        "tools": True,
        "messages": [QUESTION, {"role": "assistant", "content": None,
                                "tool_calls": [text_call("call_1", "Paris")]}, result("call_1", "18 C, sunny")],
    },
    "tool_call_empty_content": {
        "tools": True,
        "messages": [QUESTION, {"role": "assistant", "content": "", "tool_calls": [call("call_1", "Paris")]},
                     result("call_1", "18 C, sunny")],
    },
    "tool_call_with_text": {
        "tools": True,
        "messages": [QUESTION,
                     {"role": "assistant", "content": "Let me look.", "tool_calls": [call("call_1", "Paris")]},
                     result("call_1", "18 C, sunny"),
                     {"role": "assistant", "content": "It is sunny, 18 C."},
                     {"role": "user", "content": "Thanks!"}],
    },
    "two_calls_with_reasoning": {
        "tools": True,
        "messages": [{"role": "system", "content": "You are terse."},
                     {"role": "user", "content": "Weather in Paris and Rome?"},
                     {"role": "assistant", "content": None, "reasoning_content": "I need two lookups.",
                      "tool_calls": [call("call_1", "Paris"), call("call_2", "Rome")]},
                     result("call_1", "18 C, sunny"), result("call_2", "22 C, clear")],
    },
    "tools_offered": {"tools": True, "messages": [QUESTION]},
    "reasoning_text_and_calls": {
        "tools": True,
        "messages": [QUESTION,
                     {"role": "assistant", "content": "Let me look.", "reasoning_content": "A lookup.",
                      "tool_calls": [call("call_1", "Paris")]},
                     result("call_1", "18 C, sunny")],
    },
}

# bmoe's thinking settings: (enable_thinking, reasoning_effort).
BMOE = {
    "default": (True, None),
    "off": (False, None),
    "low": (True, "low"),
    "medium": (True, "medium"),
    "high": (True, "high"),
}

# For each template, the settings it has and the keyword arguments that ask
# it for the same (read from its source). A template that reads no switch
# has only "default", rendered without any.
SETTINGS = {
    "Cohere2MoE": {"default": {}, "off": {"reasoning_effort": "none"}},
    "GLM-4.7-Flash": {"default": {"enable_thinking": True}, "off": {"enable_thinking": False}},
    "Hunyuan-Hy3": {
        "default": {"reasoning_effort": "high"},
        "off": {"reasoning_effort": "no_think"},
        "low": {"reasoning_effort": "low"},
        "high": {"reasoning_effort": "high"},
    },
    "Kimi-K3": {
        "default": {"thinking": True},
        "off": {"thinking": False},
        "low": {"thinking": True, "thinking_effort": "low"},
        "medium": {"thinking": True, "thinking_effort": "medium"},
        "high": {"thinking": True, "thinking_effort": "high"},
    },
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": {"default": {"enable_thinking": True}, "off": {"enable_thinking": False}},
    "Qwen-Qwen3-0.6B": {"default": {"enable_thinking": True}, "off": {"enable_thinking": False}},
    "Qwen3.5-4B": {"default": {"enable_thinking": True}, "off": {"enable_thinking": False}},
    "Seed-OSS": {"default": {}, "off": {"thinking_budget": 0}},
    "deepseek-ai-DeepSeek-V4-Flash-0731": {
        "default": {"enable_thinking": True},
        "off": {"enable_thinking": False},
        "high": {"enable_thinking": True, "reasoning_effort": "high"},
    },
    "google-gemma-4-31B-it": {"default": {"enable_thinking": True}, "off": {"enable_thinking": False}},
    "granite-3.3": {"default": {"thinking": True}, "off": {"thinking": False}},
    "muse-glimmer": {
        "default": {},
        "low": {"reasoning_strength": "low"},
        "medium": {"reasoning_strength": "medium"},
        "high": {"reasoning_strength": "high"},
    },
    "openai-gpt-oss-120b": {
        "default": {},
        "low": {"reasoning_effort": "low"},
        "medium": {"reasoning_effort": "medium"},
        "high": {"reasoning_effort": "high"},
    },
    "upstage-Solar-Open-100B": {
        "default": {"reasoning_effort": "high"},
        "off": {"reasoning_effort": "minimal"},
        "low": {"reasoning_effort": "low"},
        "medium": {"reasoning_effort": "medium"},
        "high": {"reasoning_effort": "high"},
    },
}


def text_arguments(messages):
    """The messages with each call's arguments as compact JSON text."""
    messages = copy.deepcopy(messages)
    for m in messages:
        for c in m.get("tool_calls", []):
            if not isinstance(c["function"]["arguments"], str):
                c["function"]["arguments"] = json.dumps(c["function"]["arguments"], separators=(",", ":"))
    return messages


def mapping_arguments(messages):
    """The messages with each call's arguments as a mapping."""
    messages = copy.deepcopy(messages)
    for m in messages:
        for c in m.get("tool_calls", []):
            if isinstance(c["function"]["arguments"], str):
                c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    return messages


def empty_content(messages):
    """The messages with a null content as an empty string."""
    messages = copy.deepcopy(messages)
    for m in messages:
        if "content" in m and m["content"] is None:
            m["content"] = ""
    return messages


def render(source, conversation, kwargs):
    """Transformers' render of one case: the conversation as sent, else the
    first other form it takes; returns a dict for the case file. Arguments
    sent as text that the template would write as a JSON string (escaped
    quotes) or leave out (it reads them as a mapping) are given as a mapping
    instead."""
    tools = TOOLS if conversation.get("tools") else None
    generation = conversation.get("add_generation_prompt", True)

    def attempt(messages):
        return chat_template_utils.render_jinja_template(
            conversations=[messages], tools=tools, chat_template=source, add_generation_prompt=generation,
            bos_token=BOS, eos_token=EOS, **kwargs)[0][0]

    def drops_arguments(messages, out):
        """Whether the render of text arguments shows less of them than the
        render of the same arguments as a mapping."""
        try:
            mapped = attempt(mapping_arguments(messages))
        except FAILURES:
            return False
        return out.count("celsius") < mapped.count("celsius")

    sent = conversation["messages"]
    forms = [("as sent", sent), ("arguments as mappings", mapping_arguments(sent)),
             ("arguments as text", text_arguments(sent)), ("content empty", empty_content(sent)),
             ("arguments as mappings, content empty", empty_content(mapping_arguments(sent))),
             ("arguments as text, content empty", empty_content(text_arguments(sent)))]
    first_error = None
    seen = []
    for given, messages in forms:
        if messages in seen:
            continue
        seen.append(messages)
        try:
            out = attempt(messages)
        except FAILURES as e:
            first_error = first_error or f"{type(e).__name__}: {e}"
            continue
        if messages != mapping_arguments(messages) and ('\\"city\\"' in out or drops_arguments(messages, out)):
            continue
        return {"given": given, "render": out}
    return {"error": first_error}


def bmoe_settings(bmoe, path):
    """The keyword arguments bmoe passes `path` with thinking on (default)
    and off, where they differ; `None` where bmoe cannot read the template."""
    def variables(*flags):
        run = subprocess.run([bmoe, "template", str(path), "--variables", *flags], capture_output=True, text=True)
        return json.loads(run.stdout) if run.returncode == 0 else None
    on, off = variables(), variables("--no-think")
    if on is None or off is None:
        return None
    return {"default": on} if on == off else {"default": on, "off": off}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--templates", type=pathlib.Path, default=TEMPLATES, help="the folder of .jinja files")
    parser.add_argument("--out", type=pathlib.Path, default=OUT, help="where the renders go")
    parser.add_argument("--bmoe", help="a bmoe binary: take each template's settings from it, not SETTINGS")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "conversations.json").write_text(json.dumps(
        {"tools": TOOLS, "bos": BOS, "eos": EOS, "now": NOW.isoformat(), "settings": BMOE,
         "conversations": CONVERSATIONS}, indent=1, ensure_ascii=False) + "\n")
    names = sorted(p.stem for p in args.templates.glob("*.jinja"))
    unknown = set(SETTINGS) - set(names)
    if unknown and not args.bmoe:
        sys.exit(f"template-renders: SETTINGS names templates that are not there: {sorted(unknown)}")
    for name in names:
        path = args.templates / f"{name}.jinja"
        source = path.read_text()
        settings = bmoe_settings(args.bmoe, path) if args.bmoe else SETTINGS.get(name, {"default": {}})
        if settings is None:
            print(f"{name}: bmoe cannot read it (run bmoe template {path} --variables)")
            settings = {"default": {}}
        cases = []
        for setting, kwargs in settings.items():
            for conv_name, conversation in CONVERSATIONS.items():
                case = {"conversation": conv_name, "setting": setting, "kwargs": kwargs}
                case.update(render(source, conversation, kwargs))
                cases.append(case)
        doc = {"template": f"{name}.jinja", "transformers": transformers.__version__, "jinja2": jinja2.__version__,
               "cases": cases}
        (args.out / f"{name}.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
        errors = sum("error" in c for c in cases)
        print(f"{name}: {len(cases)} cases, {errors} refused by the template")


if __name__ == "__main__":
    main()
