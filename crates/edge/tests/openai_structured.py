"""Structured outputs and tool calls through the real `openai` client against a running edge
server with Qwen2.5-Coder-1.5B (started by tests/structured.rs).

Usage: python openai_structured.py BASE_URL MODEL
Exits non-zero on the first failed check.
"""

import concurrent.futures
import json
import sys
import urllib.error
import urllib.request
from typing import Literal

import jsonschema
import openai
from openai import OpenAI
from pydantic import BaseModel

BASE, MODEL = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=BASE, api_key="unused", max_retries=0, timeout=600)


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print("ok:", what.split("\n")[0][:110], flush=True)


def user(text):
    return [{"role": "user", "content": text}]


# response_format json_schema: 20 prompts, half greedy and half sampled, half after the cloud
# prompt "support", eight at a time in the batch; every answer parses and validates.
TICKET = {
    "type": "object",
    "properties": {
        "summary": {"type": "string", "maxLength": 60},
        "priority": {"enum": ["low", "medium", "high"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3},
        "refund": {"type": "boolean"},
    },
    "required": ["summary", "priority", "tags", "refund"],
    "additionalProperties": False,
}
PROMPTS = [
    "My train was cancelled and I want my money back.",
    "The wifi on the 8:15 did not work.",
    "I left my bag on the train to Lyon.",
    "Can I change my seat to a window seat?",
    "The conductor was rude to my mother.",
    "I was charged twice for one ticket.",
    "Is there a discount for students?",
    "The toilet in coach 4 was broken.",
    "My bike was not allowed on board although I booked it.",
    "The app crashes when I open my tickets.",
    "I need an invoice for my company.",
    "The train was two hours late.",
    "How do I book assistance for a wheelchair?",
    "My dog was refused although it was small.",
    "The heating did not work in winter.",
    "I bought the wrong date by mistake.",
    "The café car had no food left.",
    "My seat reservation was given to someone else.",
    "Can I get a refund for an unused pass?",
    "The platform changed without an announcement.",
]


def ticket(i):
    kw = {"temperature": 0} if i % 2 == 0 else {"temperature": 0.8, "seed": i}
    extra = {"cloud_prompt": "support"} if i % 4 < 2 else {}
    r = client.chat.completions.create(
        model=MODEL,
        messages=user(f"File this complaint as a ticket: {PROMPTS[i]}"),
        response_format={"type": "json_schema",
                         "json_schema": {"name": "ticket", "schema": TICKET, "strict": True}},
        max_tokens=200, extra_body=extra, **kw)
    return r.choices[0]


with concurrent.futures.ThreadPoolExecutor(8) as pool:
    choices = list(pool.map(ticket, range(len(PROMPTS))))
for i, c in enumerate(choices):
    check(c.finish_reason == "stop", f"json_schema answer {i} ends by itself: {c.finish_reason}")
    v = json.loads(c.message.content)
    jsonschema.validate(v, TICKET)
    check(True, f"json_schema answer {i} validates: {c.message.content}")
# The same request alone gives the same bits as it did in the batch of eight.
check(ticket(0).message.content == choices[0].message.content, "json_schema alone == in a batch")
check(ticket(1).message.content == choices[1].message.content, "sampled json_schema alone == in a batch")

# Streamed: the deltas join to the whole answer.
parts = []
for ch in client.chat.completions.create(
        model=MODEL, messages=user(f"File this complaint as a ticket: {PROMPTS[0]}"),
        response_format={"type": "json_schema", "json_schema": {"name": "t", "schema": TICKET}},
        max_tokens=200, temperature=0, extra_body={"cloud_prompt": "support"}, stream=True):
    if ch.choices and ch.choices[0].delta.content:
        parts.append(ch.choices[0].delta.content)
check("".join(parts) == choices[0].message.content, "streamed json_schema == whole")


# The client's own structured-output helper, from a pydantic model.
class Contact(BaseModel):
    name: str
    city: Literal["Paris", "Oslo", "Lima"]
    age: int


p = client.chat.completions.parse(model=MODEL, messages=user("Invent a customer who lives in Oslo."),
                                  response_format=Contact, temperature=0, max_tokens=200)
parsed = p.choices[0].message.parsed
check(isinstance(parsed, Contact) and parsed.city in ("Paris", "Oslo", "Lima"),
      f"chat.completions.parse gives a Contact: {parsed!r}")

# json_object: any JSON object, on chat and on completions.
r = client.chat.completions.create(model=MODEL, messages=user("List two colours as JSON."),
                                   response_format={"type": "json_object"}, temperature=0, max_tokens=120)
check(isinstance(json.loads(r.choices[0].message.content), dict), f"json_object: {r.choices[0].message.content}")
c = client.completions.create(model=MODEL, prompt="A JSON object with a cat's name and age:", max_tokens=300,
                              temperature=0, extra_body={"response_format": {"type": "json_object"}})
check(isinstance(json.loads(c.choices[0].text), dict), f"completions json_object: {c.choices[0].text}")

# The grammar extension (llguidance's Lark).
r = client.chat.completions.create(model=MODEL, messages=user("Is Oslo in Norway?"), temperature=0,
                                   max_tokens=8, extra_body={"grammar": 'start: "yes" | "no"'})
check(r.choices[0].message.content in ("yes", "no"), f"grammar: {r.choices[0].message.content!r}")
r = client.chat.completions.create(model=MODEL, messages=user("A time for the meeting?"), temperature=0,
                                   max_tokens=8, extra_body={"grammar": r"start: /[0-2][0-9]:[0-5][0-9]/"})
t = r.choices[0].message.content
check(len(t) == 5 and t[2] == ":" and t.replace(":", "").isdigit(), f"regex terminal: {t!r}")

# Tools: a call, its result, the answer.
WEATHER = {"type": "object",
           "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city"]}
BOOK = {"type": "object",
        "properties": {"origin": {"type": "string"}, "destination": {"type": "string"},
                       "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}},
        "required": ["origin", "destination", "date"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The current weather in a city",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "book_ticket", "description": "Book a train ticket",
                                      "parameters": BOOK}},
]
SCHEMAS = {"get_weather": WEATHER, "book_ticket": BOOK}


def valid_call(call):
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, SCHEMAS[call.function.name])
    return args


msgs = user("What is the weather in Oslo right now?")
# auto: the model may answer in text, but a call it writes is always in the checked form.
a = client.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS, temperature=0, max_tokens=120)
a = a.choices[0].message
for c in a.tool_calls or []:
    json.loads(c.function.arguments)
check(a.tool_calls or not a.content.lstrip().startswith(("{", "```")),
      f"auto: calls in the checked form, or text that is not a bare call: {str(a)[:200]}")
r1 = client.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS, tool_choice="required",
                                    temperature=0, max_tokens=120)
c1 = r1.choices[0]
check(c1.finish_reason == "tool_calls" and len(c1.message.tool_calls) >= 1,
      f"the model calls a tool: {c1.message}")
call = c1.message.tool_calls[0]
args = valid_call(call)
check(call.function.name == "get_weather" and "Oslo" in args["city"] and call.id.startswith("call_"),
      f"the call names get_weather for Oslo, arguments valid: {call}")
msgs2 = msgs + [c1.message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id,
                 "content": json.dumps({"temperature_c": -7, "sky": "snow"})}]
r2 = client.chat.completions.create(model=MODEL, messages=msgs2, tools=TOOLS, temperature=0, max_tokens=120)
c2 = r2.choices[0]
check(c2.finish_reason == "stop" and not c2.message.tool_calls and c2.message.content,
      f"with the tool's result the model answers in text: {c2.message.content!r}")
check(r2.usage.prompt_tokens > r1.usage.prompt_tokens + 20, "the second turn renders the call and its result")

# Streamed: the tool call comes as a delta equal to the whole answer's call.
streamed, finish = {}, None
for ch in client.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS, tool_choice="required",
                                         temperature=0, max_tokens=120, stream=True):
    for d in (ch.choices[0].delta.tool_calls or []) if ch.choices else []:
        e = streamed.setdefault(d.index, {"name": "", "arguments": ""})
        e["name"] += d.function.name or ""
        e["arguments"] += d.function.arguments or ""
    if ch.choices and ch.choices[0].finish_reason:
        finish = ch.choices[0].finish_reason
check(finish == "tool_calls" and streamed[0]["name"] == call.function.name
      and streamed[0]["arguments"] == call.function.arguments,
      f"streamed tool call == whole: {streamed}")

# required: the answer is a call, to one of the tools, valid under its schema.
r = client.chat.completions.create(model=MODEL, messages=user("I need to go from Oslo to Bergen on 2026-12-24."),
                                   tools=TOOLS, tool_choice="required", temperature=0, max_tokens=160)
calls = r.choices[0].message.tool_calls
check(r.choices[0].finish_reason == "tool_calls" and calls, f"required: calls {calls}")
for c in calls:
    valid_call(c)
check(True, f"required: every call validates ({[c.function.name for c in calls]})")
# A named function, even where the model would rather chat.
r = client.chat.completions.create(model=MODEL, messages=user("Hello there!"), tools=TOOLS,
                                   tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                   temperature=0, max_tokens=120)
calls = r.choices[0].message.tool_calls
check(calls and len(calls) == 1 and calls[0].function.name == "get_weather" and valid_call(calls[0]) is not None,
      f"named tool_choice forces that call: {calls}")
# none: tools are not offered, the answer is text.
r = client.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS, tool_choice="none",
                                   temperature=0, max_tokens=40)
check(not r.choices[0].message.tool_calls and r.choices[0].message.content, "tool_choice none: text")


# Bad requests: 400 with a reason, and the server keeps serving.
def refused(what, **kw):
    try:
        client.chat.completions.create(model=MODEL, messages=user("hi"), max_tokens=4, **kw)
        check(False, f"{what} refused")
    except openai.BadRequestError as e:
        check(e.status_code == 400, f"{what} -> 400: {e.message[:80]}")


refused("a schema llguidance cannot compile",
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}})
refused("a json_schema without a schema", response_format={"type": "json_schema", "json_schema": {"name": "x"}})
refused("an unknown response_format", response_format={"type": "xml"})
refused("a grammar that does not parse", extra_body={"grammar": "start: ("})
refused("a tool_choice naming no tool", tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "fly"}})
refused("tools with response_format", tools=TOOLS, tool_choice="required",
        response_format={"type": "json_object"})
refused("a tool with a bad name", tools=[{"type": "function", "function": {"name": "a b"}}])
r = client.chat.completions.create(model=MODEL, messages=user("Say hi."), max_tokens=4, temperature=0)
check(len(r.choices[0].message.content) > 0, "still serving")
print("all structured-output checks passed")
