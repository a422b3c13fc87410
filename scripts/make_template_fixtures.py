"""Renders real chat templates the way transformers does, for wick's tests.

    pip install jinja2==3.1.6 markupsafe==3.0.4
    python3 scripts/make_template_fixtures.py [--check-transformers]

Writes tests/fixtures/chat_templates/expected.json: every template in
TEMPLATES rendered over every conversation in CASES (the text, or the error
the render raised), and SNIPPETS, small templates that pin down the
environment itself (tojson's options, strftime_now, Python's str() of
values, string and dict methods, loop controls).

The environment is the one transformers' `apply_chat_template` builds
(transformers/utils/chat_template_utils.py, 5.23.0), rebuilt here from
jinja2 alone so neither torch nor transformers is needed:
ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and the
loopcontrols extension; `tojson` as `json.dumps` with ensure_ascii=False and
its indent, separators and sort_keys options; `raise_exception` raising
TemplateError; `strftime_now` formatting the current local time. As
`apply_chat_template` does, message keys whose value is None are dropped and
`tools` and `documents` are passed as None when absent, and a turn's
reasoning is passed as both `reasoning_content` and `thinking`. The clock is fixed
at NOW so the fixtures are reproducible; the Rust test injects the same
time. transformers' `{% generation %}` tag, and its narrowed `dict` and
`namespace` globals (jinja2's own, refusing underscore names), are left out:
no template here uses them.

--check-transformers (needs `pip install transformers==5.23.0`, no torch)
renders every case again through transformers' own `apply_chat_template`
with its clock patched to NOW, and fails on any difference.

wick's tests read expected.json and never run Python.
"""

import datetime
import json
import pathlib
import sys

import importlib.metadata

import jinja2
from jinja2.exceptions import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

FIXTURES = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "chat_templates"
NOW = datetime.datetime(2026, 2, 5, 9, 7, 3)

# file -> (bos_token, eos_token), the token texts each model's tokenizer has.
TEMPLATES = {
    "HuggingFaceTB-SmolLM2-135M-Instruct.jinja": ("<|im_start|>", "<|im_end|>"),
    "HuggingFaceTB-SmolLM3-3B.jinja": ("", "<|im_end|>"),
    "meta-llama-Llama-3.1-8B-Instruct.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
    "meta-llama-Llama-3.2-3B-Instruct.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
    "meta-llama-Llama-3.3-70B-Instruct.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": ("<s>", "</s>"),
    "Mistral-Small-3.2-24B-Instruct-2506.jinja": ("<s>", "</s>"),
    "unsloth-mistral-Devstral-Small-2507.jinja": ("<s>", "</s>"),
    "Qwen-Qwen2.5-7B-Instruct.jinja": ("", "<|im_end|>"),
    "Qwen-Qwen3-0.6B.jinja": ("", "<|im_end|>"),
    "microsoft-Phi-3.5-mini-instruct.jinja": ("<s>", "<|endoftext|>"),
    "openai-gpt-oss-120b.jinja": ("<|startoftext|>", "<|return|>"),
}

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
# "return" is what transformers' get_json_schema adds for a documented return
# value; Mistral Nemo's template skips that key.
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current time in a time zone.",
        "parameters": {
            "type": "object",
            "properties": {"tz": {"type": "string"}},
            "required": ["tz"],
        },
        "return": {"type": "string", "description": "ISO 8601 time"},
    },
}
TOOLS = [WEATHER, CLOCK]

SYSTEM = {"role": "system", "content": "You are a terse assistant."}
ASK_WEATHER = {"role": "user", "content": "What's the weather in Zürich?"}
# Mistral's templates want 9-character alphanumeric call ids.
WEATHER_CALL = {
    "id": "a1B2c3D4e",
    "type": "function",
    "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}},
}
TIME_CALL = {
    "id": "f5G6h7I8j",
    "type": "function",
    "function": {"name": "get_time", "arguments": {"tz": "Europe/Zurich"}},
}
WEATHER_RESULT = {
    "role": "tool",
    "tool_call_id": "a1B2c3D4e",
    "name": "get_weather",
    "content": '{"temperature": 21.5, "sky": "clear"}',
}
TIME_RESULT = {
    "role": "tool",
    "tool_call_id": "f5G6h7I8j",
    "name": "get_time",
    "content": "09:07",
}

# name -> (messages, tools, add_generation_prompt)
CASES = {
    "user": ([{"role": "user", "content": "Hello!"}], None, True),
    "user_no_generation_prompt": ([{"role": "user", "content": "Hello!"}], None, False),
    "system_user": ([SYSTEM, {"role": "user", "content": "What is 2+2?"}], None, True),
    "multi_turn": (
        [
            SYSTEM,
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4"},
            {"role": "user", "content": "And 3+3?"},
        ],
        None,
        True,
    ),
    "ends_with_assistant": (
        [
            {"role": "user", "content": "Say hi."},
            {"role": "assistant", "content": "Hi."},
            {"role": "user", "content": "Again."},
            {"role": "assistant", "content": "Hi again."},
        ],
        None,
        False,
    ),
    # A thinking model's earlier answer, with its thinking apart (as wick
    # and vLLM return it): Qwen3's template shows it after the last query.
    "reasoning_history": (
        [
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4", "reasoning_content": "Two and two."},
        ],
        None,
        False,
    ),
    "whitespace_and_unicode": (
        [
            {"role": "system", "content": "  Réponds en français.\n"},
            {"role": "user", "content": '  Où est « la gare » ? "quoted" <b>tag</b> 😀\n\n'},
        ],
        None,
        True,
    ),
    "tools": ([SYSTEM, ASK_WEATHER], TOOLS, True),
    "tools_no_system": ([ASK_WEATHER], TOOLS, True),
    "tools_without_user": ([SYSTEM], TOOLS, True),
    "tool_call_and_result": (
        [SYSTEM, ASK_WEATHER, {"role": "assistant", "tool_calls": [WEATHER_CALL]}, WEATHER_RESULT],
        TOOLS,
        True,
    ),
    "tool_call_with_content_then_answer": (
        [
            ASK_WEATHER,
            {"role": "assistant", "content": "Let me check.", "tool_calls": [WEATHER_CALL]},
            WEATHER_RESULT,
            {"role": "assistant", "content": "21.5 °C and clear."},
            {"role": "user", "content": "Thanks!"},
        ],
        TOOLS,
        True,
    ),
    # OpenAI's wire format: arguments as a JSON string, not an object.
    "tool_call_string_arguments": (
        [
            ASK_WEATHER,
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": "a1B2c3D4e",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Zürich"}'},
                    }
                ],
            },
            WEATHER_RESULT,
        ],
        TOOLS,
        True,
    ),
    "two_tool_calls": (
        [
            ASK_WEATHER,
            {"role": "assistant", "tool_calls": [WEATHER_CALL, TIME_CALL]},
            WEATHER_RESULT,
            TIME_RESULT,
        ],
        TOOLS,
        True,
    ),
    "bad_tool_call_id": (
        [
            ASK_WEATHER,
            {"role": "assistant", "tool_calls": [dict(WEATHER_CALL, id="call_1")]},
            dict(WEATHER_RESULT, tool_call_id="call_1"),
        ],
        TOOLS,
        True,
    ),
    # gpt-oss's template reads a turn's reasoning as `thinking` (transformers
    # passes it under both names) and shows it only before a call whose
    # answer has not come yet.
    "thinking_before_a_call": (
        [
            SYSTEM,
            ASK_WEATHER,
            {"role": "assistant", "reasoning_content": "The user wants Zürich's weather.", "tool_calls": [WEATHER_CALL]},
            WEATHER_RESULT,
        ],
        TOOLS,
        True,
    ),
    "thinking_before_a_call_then_answer": (
        [
            ASK_WEATHER,
            {"role": "assistant", "reasoning_content": "The user wants Zürich's weather.", "tool_calls": [WEATHER_CALL]},
            WEATHER_RESULT,
            {"role": "assistant", "content": "21.5 °C and clear."},
            {"role": "user", "content": "Thanks!"},
        ],
        TOOLS,
        True,
    ),
    "roles_not_alternating": (
        [{"role": "user", "content": "One."}, {"role": "user", "content": "Two."}],
        None,
        True,
    ),
}

# Data for the snippets, passed as `tools` (a list, as transformers requires).
DATA = {
    "text": 'é "q" \\ / \n\t\x01 \x7f \xa0 😀 <&>',
    "n": 3,
    "neg": -12,
    "x": 1.5,
    "big": 1e16,
    "small": 1e-05,
    "fixed": 0.0001,
    "whole": 2.0,
    "t": True,
    "f": False,
    "none": None,
    "list": [1, "two", [], {}],
    "nested": {"b": 1, "a": [1, 2], "it's": "it's"},
}

SNIPPETS = [
    "{{ tools[0] | tojson }}",
    "{{ tools[0] | tojson(indent=2) }}",
    "{{ tools[0] | tojson(indent=0) }}",
    "{{ tools[0].nested | tojson(indent='\\t') }}",
    "{{ tools[0] | tojson(ensure_ascii=True) }}",
    "{{ tools[0] | tojson(sort_keys=True, indent=1) }}",
    "{{ tools[0] | tojson(separators=(',', ':')) }}",
    "{{ tools[0].nested | tojson(indent=2, separators=(';', '=')) }}",
    "{{ tools | tojson }}|{{ tools[0].text | tojson }}|{{ 'a' | tojson }}|{{ none | tojson }}",
    "{{ tools[0].missing | tojson }}",
    "{{ strftime_now('%Y-%m-%d %H:%M:%S') }}|{{ strftime_now('%d %b %Y') }}",
    "{{ strftime_now('%A %B %-d %y, %I:%M %p, day %j, %a %e %%') }}|{{ strftime_now('[%z%Z]') }}",
    "{{ none }}|{{ true }}|{{ false }}|{{ 2.0 }}|{{ 7 / 2 }}|{{ 4 / 2 }}|{{ 7 // 2 }}|{{ tools[0].none }}",
    "{{ tools[0].big }}|{{ tools[0].small }}|{{ tools[0].fixed }}|{{ tools[0].x }}|{{ tools[0].neg }}",
    "{{ tools[0].list }}|{{ tools[0].nested }}|{{ tools[0].t }}",
    "{{ tools[0] }}",
    "{{ messages[0] }}|{{ messages[0].content }}",
    "{{ tools[0].list | string }}|{{ tools[0].f | string }}|{{ tools[0].none | string }}|{{ 3 | string }}",
    "{{ '  a b  '.strip() }}|{{ 'x,y'.split(',') }}|{{ ' a  b '.split() }}|{{ '--x--'.rstrip('-') }}"
    "|{{ '--x--'.lstrip('-') }}|{{ ' x '.lstrip() }}",
    "{{ 'Hello'.startswith('He') }}|{{ 'Hello'.endswith('lo') }}|{{ 'a-b-c'.replace('-', '+') }}"
    "|{{ 'aXbXc'.replace('X', '', 1) }}|{{ 'hello world'.title() }}|{{ 'hello'.capitalize() }}"
    "|{{ 'MiXed'.lower() }}|{{ 'MiXed'.upper() }}|{{ 'banana'.count('a') }}|{{ 'banana'.find('n') }}",
    "{{ 'l1\\nl2'.splitlines() }}|{{ '{}-{}'.format(1, 'b') }}|{{ '42'.isdigit() }}|{{ 'ab'.isalpha() }}",
    "{% for k, v in tools[0].nested.items() %}{{ k }}={{ v }};{% endfor %}"
    "|{{ tools[0].get('missing', 'dflt') }}|{{ tools[0].get('missing') }}|{{ tools[0].get('n') }}"
    "|{{ tools[0].nested.keys() | list }}|{{ tools[0].nested.values() | list }}",
    "{{ 'a' is iterable }}|{{ tools[0] is mapping }}|{{ tools[0].list is sequence }}|{{ 'a' is string }}"
    "|{{ 'tool_calls' in messages[0] }}|{{ 'role' in messages[0] }}",
    "{% for i in range(6) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 4 %}{% break %}{% endif %}"
    "{{ i }}{% endfor %}",
    "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}",
    "{% for x in tools[0].list if x is number %}{{ x }}{{ loop.last }}{% endfor %}",
    "{{ raise_exception('Custom failure: ' ~ messages | length) }}",
    "  {% if true %}\nA\n  {% endif %}\nB\n    {%- if false %}C{% else %}  D{% endif %}\n",
    "[{{ bos_token }}][{{ eos_token }}][{{ add_generation_prompt }}][{{ documents }}]",
    "{{ tools[0].list | length }}|{{ [3, 1, 2] | sort }}|{{ tools[0].nested | list }}",
    "{{ true ~ 'x' ~ none }}|{{ [true, none, 1.5] | join(',') }}|{{ tools[0].n * 'ab' }}",
    "{{ tools[0].list[1:] }}|{{ 'hello'[::-1] }}|{{ tools[0]['nested']['it\\'s'] }}|{{ tools[0].nested.it }}",
    "{% set x = {'b': 1, 'a': 2} %}{{ x | tojson }}{{ x }}",
    "{{ messages | selectattr('role', 'equalto', 'user') | list | length }}"
    "|{{ messages[0] == {'role': 'user', 'content': 'hi'} }}",
    "{{ 'a' + 1 }}",
    "{{ tools[0].missing.attr }}",
]
SNIPPET_MESSAGES = [{"role": "user", "content": "hi"}]
SNIPPET_TOKENS = ("<s>", "</s>")


# The names a turn's reasoning may come under, the first the one templates read.
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def strftime_now(fmt):
    return NOW.strftime(fmt)


def raise_exception(message):
    raise TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def alias_reasoning(message):
    """A turn's reasoning under each name templates read it by, as
    transformers' `_alias_reasoning_fields` passes it: `thinking` (gpt-oss)
    first, `reasoning_content` where it was or last."""
    reasoning = next((message[k] for k in REASONING_FIELDS if message.get(k) is not None), None)
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}


def render(env, source, messages, tools, add_generation_prompt, tokens):
    """The text, or the error: `raised` when the template called raise_exception."""
    messages = [alias_reasoning({k: v for k, v in m.items() if v is not None}) for m in messages]
    try:
        text = env.from_string(source).render(
            messages=messages,
            tools=tools,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            bos_token=tokens[0],
            eos_token=tokens[1],
        )
    except jinja2.exceptions.TemplateError as e:
        # raise_exception raises TemplateError itself; jinja2's own errors are subclasses.
        return {"error": str(e), "raised": type(e) is TemplateError}
    except Exception as e:  # noqa: BLE001 - what templates hit: TypeError, KeyError, ...
        return {"error": f"{type(e).__name__}: {e}", "raised": False}
    return {"text": text}


def check_transformers(renders, templates):
    """Every case again through transformers' own apply_chat_template."""
    import transformers.utils.chat_template_utils as ctu
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    class FixedClock(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return NOW

    ctu.datetime = FixedClock
    failures = 0
    for r in renders:
        bos, eos = TEMPLATES[r["template"]]
        vocab = {"<unk>": 0, bos or "<bos>": 1, eos: 2}
        tok = PreTrainedTokenizerFast(
            tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="<unk>")),
            bos_token=bos or None,
            eos_token=eos,
        )
        messages, tools, agp = CASES[r["case"]]
        try:
            got = {"text": tok.apply_chat_template(
                messages, tools=tools, chat_template=templates[r["template"]],
                add_generation_prompt=agp, tokenize=False,
            )}
        except Exception as e:  # noqa: BLE001
            got = {"error": str(e)}
        if got.get("text") != r.get("text") or ("error" in got) != ("error" in r):
            failures += 1
            print(f"MISMATCH {r['template']} / {r['case']}:\n  ours {r}\n  transformers {got}")
        elif "error" in r and r["raised"] and got["error"] != r["error"]:
            failures += 1
            print(f"MISMATCH error {r['template']} / {r['case']}: {r['error']!r} vs {got['error']!r}")
    print(f"transformers {ctu.__name__}: {len(renders) - failures} of {len(renders)} renders agree")
    if failures:
        sys.exit(1)


def main():
    env = environment()
    templates = {name: (FIXTURES / name).read_text() for name in TEMPLATES}
    renders = []
    for name, tokens in TEMPLATES.items():
        for case, (messages, tools, agp) in CASES.items():
            out = render(env, templates[name], messages, tools, agp, tokens)
            renders.append({"template": name, "case": case, **out})
    snippets = [
        {"source": s, **render(env, s, SNIPPET_MESSAGES, [DATA], True, SNIPPET_TOKENS)} for s in SNIPPETS
    ]
    expected = {
        "generator": "scripts/make_template_fixtures.py",
        "jinja2": importlib.metadata.version("jinja2"),
        "markupsafe": importlib.metadata.version("markupsafe"),
        "python": sys.version.split()[0],
        "now": NOW.isoformat(),
        "templates": {name: {"bos_token": b, "eos_token": e} for name, (b, e) in TEMPLATES.items()},
        "cases": {
            case: {"messages": m, "tools": t, "add_generation_prompt": agp}
            for case, (m, t, agp) in CASES.items()
        },
        "renders": renders,
        "snippets": {
            "messages": SNIPPET_MESSAGES,
            "tools": [DATA],
            "bos_token": SNIPPET_TOKENS[0],
            "eos_token": SNIPPET_TOKENS[1],
            "add_generation_prompt": True,
            "expected": snippets,
        },
    }
    out = FIXTURES / "expected.json"
    out.write_text(json.dumps(expected, indent=1, ensure_ascii=False) + "\n")
    errors = sum("error" in r for r in renders)
    print(f"wrote {out}: {len(renders)} renders ({errors} errors), {len(snippets)} snippets")
    if "--check-transformers" in sys.argv[1:]:
        check_transformers(renders, templates)


if __name__ == "__main__":
    main()
