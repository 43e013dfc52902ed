"""The real `openai` client against a running edge server (started by tests/http_api.rs).

Usage: python openai_api.py CONFIG.json
CONFIG: {"base": url, "tiny": url, "model": id, "system_a": str, "system_b": str,
         "user": str, "prompt_tokens": int}
Exits non-zero on the first failed check.
"""

import concurrent.futures
import json
import sys
import time
import urllib.error
import urllib.request

import openai
from openai import OpenAI

cfg = json.load(open(sys.argv[1]))
MODEL = cfg["model"]
client = OpenAI(base_url=cfg["base"], api_key="unused", max_retries=0, timeout=600)
tiny = OpenAI(base_url=cfg["tiny"], api_key="unused", max_retries=0, timeout=600)


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print("ok:", what.split("\n")[0][:110], flush=True)


def chat(c, system, user, **kw):
    msgs = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": user}
    ]
    kw.setdefault("temperature", 0)
    return c.chat.completions.create(model=MODEL, messages=msgs, **kw)


def raw_post(base, path, body: bytes):
    req = urllib.request.Request(
        base.rstrip("/") + path, data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def get(base, path):
    with urllib.request.urlopen(base.rstrip("/") + path) as r:
        return r.read().decode()


root = cfg["base"].rsplit("/v1", 1)[0]
tiny_root = cfg["tiny"].rsplit("/v1", 1)[0]


def still_serving(c=client):
    r = chat(c, cfg["system_a"], "Say hi.", max_tokens=4)
    check(r.choices[0].message.content is not None, "server still serves")


# Models
models = client.models.list().data
ids = [m.id for m in models]
check(ids == [MODEL], f"/v1/models lists the served model: {ids}")
ctx = (models[0].model_extra or {}).get("context_length")
check(ctx == cfg["context_length"], f"/v1/models gives the context length: {ctx}")

# Chat, non-streaming, greedy, usage counts
r = chat(client, cfg["system_a"], cfg["user"], max_tokens=24)
text = r.choices[0].message.content
check(len(text) > 0, f"chat answers: {text!r}")
check(r.choices[0].finish_reason in ("length", "stop"), "finish reason")
check(r.usage.prompt_tokens == cfg["prompt_tokens"],
      f"usage.prompt_tokens {r.usage.prompt_tokens} == cloud + private tokens {cfg['prompt_tokens']}")
if r.choices[0].finish_reason == "length":
    check(r.usage.completion_tokens == 24, "usage.completion_tokens == max_tokens")
check(r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens, "usage total")
# The EdgePrompt block: the cloud prompt's tokens and the private ones make the prompt
block = (r.model_extra or {}).get("edgeprompt") or {}
cp = block.get("cloud_prompt") or {}
check(cp.get("tokens", 0) + block.get("private_tokens", 0) == cfg["prompt_tokens"]
      and cp.get("source") in ("memory", "cloud") and block.get("ttft_s", 0) > 0,
      f"the edgeprompt block accounts for the prompt: {block}")

# Streaming gives the same text and usage
s = chat(client, cfg["system_a"], cfg["user"], max_tokens=24, stream=True,
         stream_options={"include_usage": True})
parts, finish, usage, blocks = [], None, None, []
for ch in s:
    if ch.usage:
        usage = ch.usage
    if (ch.model_extra or {}).get("edgeprompt"):
        blocks.append(ch.model_extra["edgeprompt"])
    for c in ch.choices:
        if c.delta.content:
            parts.append(c.delta.content)
        finish = c.finish_reason or finish
check("".join(parts) == text, "streamed deltas join to the non-streamed answer")
check(len(parts) > 3, f"streamed in {len(parts)} pieces")
check(finish == r.choices[0].finish_reason, "stream finish reason")
check(len(blocks) == 1 and blocks[0]["private_tokens"] == block["private_tokens"]
      and blocks[0]["cloud_prompt"]["source"] == "memory", f"one streamed edgeprompt block: {blocks}")
check(usage is not None and usage.completion_tokens == r.usage.completion_tokens
      and usage.prompt_tokens == r.usage.prompt_tokens, "stream usage chunk")

# The cloud prompt named by id (EdgePrompt extension) is the same prefix as the system text
r_id = client.chat.completions.create(
    model=MODEL, temperature=0, max_tokens=24,
    messages=[{"role": "user", "content": cfg["user"]}], extra_body={"cloud_prompt": cfg["cloud_prompt_a"]})
check(r_id.choices[0].message.content == text, "cloud_prompt id == system message text")

# Stop sequences: cut at the first occurrence, finish_reason stop
words = text.split()
stop = next((w for w in words[2:] if len(w) >= 3), None)
if stop:
    r2 = chat(client, cfg["system_a"], cfg["user"], max_tokens=24, stop=[stop, "@@@"])
    check(r2.choices[0].message.content == text[: text.index(stop)],
          f"stop {stop!r} cuts the answer: {r2.choices[0].message.content!r}")
    check(r2.choices[0].finish_reason == "stop", "finish_reason stop")
    check(r2.usage.completion_tokens < r.usage.completion_tokens or r.choices[0].finish_reason == "stop",
          "fewer tokens after a stop")

# Seeded sampling repeats
a = chat(client, cfg["system_b"], cfg["user"], max_tokens=16, temperature=0.9, top_p=0.95, seed=7)
b = chat(client, cfg["system_b"], cfg["user"], max_tokens=16, temperature=0.9, top_p=0.95, seed=7)
check(a.choices[0].message.content == b.choices[0].message.content, "same seed, same sample")

# Malformed JSON: 400 with a message, then still serving
code, body = raw_post(cfg["base"], "/chat/completions", b'{"model": "x", "messages": [')
check(code == 400 and "invalid request body" in json.loads(body)["error"]["message"],
      f"malformed JSON -> 400: {body}")
code, body = raw_post(cfg["base"], "/chat/completions", b'{"model": 3}')
check(code == 400, f"wrong field type -> 400: {body}")
still_serving()

# Unknown model: 404
try:
    client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    check(False, "unknown model refused")
except openai.NotFoundError as e:
    check("no-such-model" in str(e), f"unknown model -> 404: {e}")
still_serving()

# Oversize prompt: 400
try:
    chat(client, cfg["system_a"], "hello " * 9000, max_tokens=4)
    check(False, "oversize prompt refused")
except openai.BadRequestError as e:
    check("context" in str(e), f"oversize prompt -> 400: {str(e)[:100]}")
still_serving()

# Bad parameters: 400
try:
    chat(client, cfg["system_a"], "x", temperature=5)
    check(False, "temperature 5 refused")
except openai.BadRequestError:
    check(True, "temperature out of range -> 400")

# A system message the cloud does not know is computed on the edge
r3 = chat(client, "You are a pirate. Answer in one sentence.", "Where is the treasure?", max_tokens=8)
check(len(r3.choices[0].message.content) > 0, "unknown system prompt computed locally")
# ... or refused where configured (the tiny server refuses)
try:
    chat(tiny, "You are a pirate. Answer in one sentence.", "Where is the treasure?", max_tokens=8)
    check(False, "unknown system prompt refused on the strict server")
except openai.BadRequestError as e:
    check("not a registered cloud prompt" in str(e), "unknown system prompt -> 400 where refused")

# Legacy completions
c = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0)
check(len(c.choices[0].text) > 0 and c.usage.completion_tokens > 0, f"completions: {c.choices[0].text!r}")

# 16 concurrent greedy requests over two cloud prompts: each equals its answer alone
questions = [
    "How do I get a refund?", "Is my train on time?", "Can I bring a bike?",
    "What is the fee for late cancellation?", "Explain the refund rule in one line.",
    "I missed my train, what now?", "Do children travel free?", "Write a short apology.",
]
jobs = [(sys_, q) for sys_ in (cfg["system_a"], cfg["system_b"]) for q in questions]


def answer(job):
    r = chat(client, job[0], job[1], max_tokens=20)
    return r.choices[0].message.content, r.usage.completion_tokens


alone = [answer(j) for j in jobs]
with concurrent.futures.ThreadPoolExecutor(16) as ex:
    together = list(ex.map(answer, jobs))
for i, (x, y) in enumerate(zip(alone, together)):
    check(x == y, f"concurrent request {i} == alone: {y!r}")

# Admission control: the tiny server's KV budget fits one long request; a second gets 429
long_stream = tiny.completions.create(
    model=MODEL, prompt="1, 2, 3, 4, 5, 6, 7,", max_tokens=200, temperature=0, stream=True)
first = next(iter(long_stream))
try:
    tiny.completions.create(model=MODEL, prompt="1, 2, 3, 4, 5, 6, 7,", max_tokens=200, temperature=0)
    check(False, "second request over budget refused")
except openai.RateLimitError as e:
    check(e.response.headers.get("retry-after") is not None, f"over budget -> 429 with Retry-After: {e}")
# The client goes away: the server cancels the request and frees its KV
long_stream.close()
deadline = time.time() + 60
cancelled = False
while time.time() < deadline and not cancelled:
    m = get(tiny_root, "/metrics")
    cancelled = 'edgeprompt_generations_total{outcome="cancelled"} 1' in m
    time.sleep(0.2)
check(cancelled, "closed stream -> request cancelled (metrics)")
r4 = tiny.completions.create(model=MODEL, prompt="1, 2, 3,", max_tokens=4, temperature=0)
check(len(r4.choices[0].text) > 0, "budget freed after cancellation")

# Request ids: the client's id comes back in the header and names the completion; without
# one the server makes one up
raw = client.chat.completions.with_raw_response.create(
    model=MODEL, messages=[{"role": "user", "content": "Say hi."}], max_tokens=4, temperature=0,
    extra_headers={"x-request-id": "trace-42"})
check(raw.headers.get("x-request-id") == "trace-42", f"request id echoed: {raw.headers.get('x-request-id')}")
check(raw.parse().id.startswith("chatcmpl-trace-42-"), f"completion named after its request: {raw.parse().id}")
raw = client.completions.with_raw_response.create(model=MODEL, prompt="1, 2,", max_tokens=2, temperature=0)
rid = raw.headers.get("x-request-id") or ""
check(rid.startswith("req-") and raw.parse().id.startswith("cmpl-" + rid + "-"), f"server-made request id: {rid}")

# Log-probabilities (chat): each token's and its top alternatives', equal to the engine's raw
# logits through a log-softmax computed by the Rust test on one node (to 1e-5)
ref = cfg["logprobs_ref"]
r = chat(client, cfg["system_a"], cfg["user"], max_tokens=len(ref), logprobs=True, top_logprobs=3)
content = r.choices[0].logprobs.content
check(len(content) == len(ref) == r.usage.completion_tokens, f"one logprob per token: {len(content)}")
for got, want in zip(content, ref):
    check(abs(got.logprob - want["logprob"]) < 1e-5 and got.token == want["text"],
          f"logprob of {got.token!r}: {got.logprob} vs engine {want['logprob']}")
    check(len(got.top_logprobs) == 3 and all(abs(a.logprob - b[1]) < 1e-5
          for a, b in zip(got.top_logprobs, want["top"])), "top_logprobs match the engine's")
    check(got.bytes == list(got.token.encode()), "bytes are the token's UTF-8")
plain = chat(client, cfg["system_a"], cfg["user"], max_tokens=len(ref))
check(plain.choices[0].logprobs is None, "no logprobs unless asked")
# streamed: the last chunk of the answer carries them, the same values
lps = []
for ch in chat(client, cfg["system_a"], cfg["user"], max_tokens=len(ref), logprobs=True, top_logprobs=3, stream=True):
    if ch.choices and ch.choices[0].logprobs is not None:
        lps += ch.choices[0].logprobs.content
check([x.logprob for x in lps] == [x.logprob for x in content], "streamed logprobs == whole")
# completions: OpenAI's parallel lists
c = client.completions.create(model=MODEL, prompt="1, 2, 3,", max_tokens=5, temperature=0, logprobs=2)
lp = c.choices[0].logprobs
check(len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 5,
      f"completions logprobs: {lp.tokens}")
check(all(len(t) <= 2 for t in lp.top_logprobs) and all(x <= 0 for x in lp.token_logprobs),
      "completions top_logprobs and values")

# echo: the prompt's tokens scored, as evaluation harnesses ask (max_tokens 0, logprobs 1+).
# After cloud prompt "support" its first token is scored from the cloud prompt's last position;
# every value equals the engine's on one node fed one token at a time (to 1e-5).
def check_scores(lp, ref, what):
    check(len(lp.tokens) >= len(ref), f"{what}: {len(lp.tokens)} tokens for {len(ref)}")
    bad = []
    for i, want in enumerate(ref):
        got, tops = lp.token_logprobs[i], lp.top_logprobs[i]
        if want is None:
            if got is not None or tops is not None:
                bad.append((i, "nothing scores a first token", got))
        elif lp.tokens[i] != want["text"] or abs(got - want["logprob"]) >= 1e-5:
            bad.append((i, lp.tokens[i], got, want["logprob"]))
        elif len(tops) != 2 or any(abs(tops[t] - v) >= 1e-5 for t, v in want["top"]):
            bad.append((i, tops, want["top"]))
    check(not bad, f"{what}: {len(ref)} tokens and top 2 == the engine's on one node: {bad}")
    check(lp.text_offset[0] == 0 and all(a < b for a, b in zip(lp.text_offset, lp.text_offset[1:])),
          f"{what}: text offsets rise")

support = {"cloud_prompt": cfg["cloud_prompt_a"]}
e = client.completions.create(model=MODEL, prompt=cfg["echo_text"], max_tokens=0, echo=True,
                              logprobs=2, extra_body=support)
check(e.choices[0].text == cfg["echo_text"] and e.choices[0].finish_reason == "length"
      and e.usage.completion_tokens == 0, f"echo, max_tokens 0: the prompt only: {e}")
check(len(e.choices[0].logprobs.tokens) == len(cfg["echo_ref"]), "one entry per prompt token")
check_scores(e.choices[0].logprobs, cfg["echo_ref"], "echo after a cloud prompt")
plain = client.completions.create(model=MODEL, prompt=cfg["echo_text"], max_tokens=0, echo=True,
                                  logprobs=2)
check_scores(plain.choices[0].logprobs, cfg["echo_plain_ref"], "echo of a prompt of its own")
# echo with an answer: the prompt, then the same answer and values as without echo
gen = dict(model=MODEL, prompt=cfg["echo_text"], max_tokens=4, temperature=0, logprobs=2,
           extra_body=support)
both = client.completions.create(echo=True, **gen)
alone = client.completions.create(**gen)
n = len(cfg["echo_ref"])
check(both.choices[0].text == cfg["echo_text"] + alone.choices[0].text,
      f"echo text = prompt + answer: {both.choices[0].text!r}")
check(both.choices[0].logprobs.token_logprobs[n:] == alone.choices[0].logprobs.token_logprobs,
      "the answer's logprobs are the same with echo")
check_scores(both.choices[0].logprobs, cfg["echo_ref"], "echo with an answer")
streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, echo=True, **gen)
                   if c.choices)
check(streamed == both.choices[0].text, f"streamed echo == whole: {streamed!r}")
check(client.completions.create(model=MODEL, prompt="hi", max_tokens=0, echo=True)
      .choices[0].text == "hi", "echo without logprobs returns the prompt")
# Token-id prompts, as lm-evaluation-harness sends them, and the tokenizer endpoints.
status, body = raw_post(root, "/tokenize", json.dumps({"content": cfg["echo_text"]}).encode())
ids = json.loads(body)["tokens"]
check(status == 200 and len(ids) > 3, f"/tokenize: {body}")
kw = dict(model=MODEL, max_tokens=4, temperature=0, logprobs=2)
by_text = client.completions.create(prompt=cfg["echo_text"], **kw)
by_ids = client.completions.create(prompt=ids, **kw)
check(by_ids.choices[0].text == by_text.choices[0].text
      and by_ids.choices[0].logprobs.token_logprobs == by_text.choices[0].logprobs.token_logprobs,
      f"a token-id prompt answers as its text: {by_ids.choices[0].text!r}")
check(client.completions.create(prompt=[ids], **kw).choices[0].text == by_text.choices[0].text,
      "a batch of one id list too")
status, body = raw_post(root, "/detokenize", json.dumps({"tokens": ids}).encode())
check(status == 200 and json.loads(body)["content"].endswith(cfg["echo_text"]), f"/detokenize: {body}")
info = json.loads(get(root, "/tokenizer_info"))
check(info["vocab_size"] > max(ids) and info["model"] == MODEL, f"/tokenizer_info: {info}")
status, body = raw_post(cfg["base"], "/completions", json.dumps(
    {"model": MODEL, "prompt": "hi", "max_tokens": 0}).encode())
check(status == 400 and "max_tokens" in json.loads(body)["error"]["message"],
      f"max_tokens 0 without echo -> 400: {body}")
status, body = raw_post(cfg["base"], "/chat/completions", json.dumps(
    {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "echo": True}).encode())
check(status == 400 and "echo" in json.loads(body)["error"]["message"], f"chat echo -> 400: {body}")
status, body = raw_post(cfg["base"], "/chat/completions", json.dumps(
    {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "logprobs": True,
     "top_logprobs": 21}).encode())
check(status == 400, f"top_logprobs over 20 -> 400: {body}")

# n > 1: one prefill, n answers; with a seed the first equals n = 1's answer
one = chat(client, cfg["system_a"], cfg["user"], max_tokens=16, temperature=0.9, seed=11)
three = chat(client, cfg["system_a"], cfg["user"], max_tokens=16, temperature=0.9, seed=11, n=3)
check([c.index for c in three.choices] == [0, 1, 2], "n=3 gives three choices")
check(three.choices[0].message.content == one.choices[0].message.content,
      f"the first of n=3 equals n=1: {three.choices[0].message.content!r}")
check(len({c.message.content for c in three.choices}) > 1, "the answers are sampled apart")
for k in (1, 2):
    alone = chat(client, cfg["system_a"], cfg["user"], max_tokens=16, temperature=0.9, seed=11 + k)
    check(three.choices[k].message.content == alone.choices[0].message.content,
          f"answer {k} of n=3 equals n=1 with seed + {k}: the fork is exact")
check(three.usage.prompt_tokens == one.usage.prompt_tokens
      and one.usage.completion_tokens < three.usage.completion_tokens <= 3 * 16,
      f"usage of n=3: the prompt once, every answer's tokens: {three.usage}")
texts = {0: "", 1: "", 2: ""}
ends = set()
for ch in chat(client, cfg["system_a"], cfg["user"], max_tokens=16, temperature=0.9, seed=11, n=3, stream=True):
    for c in ch.choices:
        texts[c.index] += c.delta.content or ""
        if c.finish_reason:
            ends.add(c.index)
check(ends == {0, 1, 2} and [texts[i] for i in range(3)] == [c.message.content for c in three.choices],
      "n=3 streamed: each index's deltas join to its whole answer")
try:
    chat(client, cfg["system_a"], "hi", n=17)
    check(False, "n=17 refused")
except openai.BadRequestError as e:
    check("n must be" in str(e), f"n out of range -> 400: {e}")

# API keys: each key from the file works; a wrong or missing key gets OpenAI's 401; /health is open
keyed_root = cfg["keyed"].rsplit("/v1", 1)[0]
for key in cfg["keys"]:
    k = OpenAI(base_url=cfg["keyed"], api_key=key, max_retries=0, timeout=600)
    r = chat(k, cfg["system_a"], "Say hi.", max_tokens=4)
    check(r.choices[0].message.content is not None, f"key {key[:6]}... admitted")
try:
    chat(OpenAI(base_url=cfg["keyed"], api_key="sk-wrong", max_retries=0), cfg["system_a"], "Say hi.", max_tokens=4)
    check(False, "wrong key refused")
except openai.AuthenticationError as e:
    check(e.status_code == 401 and e.code == "invalid_api_key", f"wrong key -> 401 invalid_api_key: {e}")
status, body = raw_post(cfg["keyed"], "/chat/completions", json.dumps(
    {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).encode())
err = json.loads(body).get("error", {})
check(status == 401 and err.get("code") == "invalid_api_key" and err.get("type") == "invalid_request_error",
      f"no key -> 401 in OpenAI's shape: {status} {body}")
check(json.loads(get(keyed_root, "/health"))["status"] == "ok", "/health needs no key")

# Health and metrics
h = json.loads(get(root, "/health"))
check(h["status"] == "ok" and h["model"] == MODEL, f"/health: {h}")
m = get(root, "/metrics")
for name in ["edgeprompt_http_requests_total", "edgeprompt_queue_depth", "edgeprompt_ttft_seconds_bucket",
             "edgeprompt_token_latency_seconds_bucket", "edgeprompt_cloud_kv_bytes_total",
             'edgeprompt_prefix_lookups_total{source="memory"}', 'edgeprompt_prefix_lookups_total{source="cloud"}',
             'edgeprompt_prefix_lookups_total{source="private"}', "edgeprompt_private_kv_bytes"]:
    check(name in m, f"/metrics has {name}")
print("all openai client checks passed")
