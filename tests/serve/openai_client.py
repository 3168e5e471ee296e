"""Checks `flashlm serve` through the official `openai` Python client.

Usage: openai_client.py BASE_URL API_KEY
The server must run with that API key and `--queue 0` (one request at a time, no waiting).
Exits non-zero with a message on the first failed check; prints "openai client: N checks passed".
"""

import sys
import threading

import openai
from openai import OpenAI

BASE, KEY = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=BASE + "/v1", api_key=KEY, max_retries=0, timeout=120)
checks = 0


def check(cond, what):
    global checks
    if not cond:
        raise AssertionError(what)
    checks += 1


def raises(exc, fn, what):
    try:
        fn()
    except exc as e:
        check(True, what)
        return e
    except Exception as e:  # noqa: BLE001 - report the wrong class
        raise AssertionError(f"{what}: expected {exc.__name__}, got {type(e).__name__}: {e}")
    raise AssertionError(f"{what}: expected {exc.__name__}, nothing was raised")


MSGS = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hello"}]

# Models.
models = client.models.list().data
check(len(models) == 1 and models[0].id, f"one model listed: {models}")
MODEL = models[0].id

# Chat, greedy: deterministic, with usage and a finish reason.
r = client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=12, temperature=0)
c = r.choices[0]
text = c.message.content
check(isinstance(text, str), "chat content is text")
check(c.message.role == "assistant", "assistant role")
check(c.finish_reason in ("stop", "length"), f"finish reason {c.finish_reason}")
u = r.usage
check(u.prompt_tokens > 0 and 0 < u.completion_tokens <= 12, f"usage {u}")
check(u.total_tokens == u.prompt_tokens + u.completion_tokens, "total = prompt + completion")
check(r.object == "chat.completion" and r.id.startswith("chatcmpl-"), "chat object and id")
again = client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=12, temperature=0)
check(again.choices[0].message.content == text, "greedy chat is deterministic")

# Chat streaming: role first, the same text as the whole answer, a finish reason, usage last.
chunks = list(
    client.chat.completions.create(
        model=MODEL, messages=MSGS, max_tokens=12, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )
)
check(chunks[0].choices[0].delta.role == "assistant", "the first chunk carries the role")
streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
check(streamed == text, f"streamed chat {streamed!r} == whole {text!r}")
finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
check(finishes == [c.finish_reason], f"one finish reason: {finishes}")
check(chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == u.completion_tokens,
      "usage chunk last")
check(all(ch.object == "chat.completion.chunk" for ch in chunks), "chunk objects")

# Completions, whole and streamed.
PROMPT = "Once upon a time"
r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0)
ctext = r.choices[0].text
check(r.choices[0].finish_reason == "length" or r.usage.completion_tokens < 16, "length finish")
check(r.object == "text_completion", "completion object")
check(client.completions.create(model=MODEL, prompt=[PROMPT], max_tokens=16, temperature=0)
      .choices[0].text == ctext, "a one-string prompt array is the same prompt")
parts = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0,
                                       stream=True))
check("".join(p.choices[0].text for p in parts) == ctext, "streamed completion == whole")
check(parts[-1].choices[0].finish_reason == r.choices[0].finish_reason, "streamed finish reason")
check(sum(1 for p in parts if p.choices[0].text) > 1, "the completion came in several chunks")

# Stop sequences: cut at the first occurrence, not included, finish reason "stop".
check(len(ctext) >= 6, f"a completion long enough to cut: {ctext!r}")
if len(ctext) >= 6:
    stop = ctext[len(ctext) // 2: len(ctext) // 2 + 2]
    want = ctext[: ctext.find(stop)]
    for stream in (False, True):
        res = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0,
                                        stop=[stop, "\u0000never"], stream=stream)
        if stream:
            res = list(res)
            got = "".join(p.choices[0].text for p in res)
            fin = res[-1].choices[0].finish_reason
        else:
            got, fin = res.choices[0].text, res.choices[0].finish_reason
        check(got == want, f"stop {stop!r} (stream={stream}): {got!r} != {want!r}")
        check(fin == "stop", f"stop finish reason (stream={stream}): {fin}")

# Seeded sampling repeats; other seeds (almost surely) differ somewhere.
def sample(seed):
    return client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=1.0,
                                     top_p=0.95, seed=seed).choices[0].text


check(sample(42) == sample(42), "the same seed gives the same text")
check(len({sample(s) for s in range(1, 5)}) > 1, "different seeds give different texts")

# Errors raise the client's exception classes.
raises(openai.BadRequestError,
       lambda: client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=-1),
       "negative max_tokens")
raises(openai.BadRequestError,
       lambda: client.chat.completions.create(model=MODEL, messages=MSGS, temperature=-0.5),
       "negative temperature")
raises(openai.BadRequestError,
       lambda: client.chat.completions.create(model=MODEL, messages=MSGS, top_p=1.5),
       "top_p over 1")
raises(openai.BadRequestError,
       lambda: client.chat.completions.create(model=MODEL, messages=MSGS, n=2),
       "n = 2")
e = raises(openai.BadRequestError,
           lambda: client.chat.completions.create(model=MODEL, messages=MSGS,
                                                  extra_body={"frobnicate": 1}),
           "unknown field")
check(e.body and e.body.get("param") == "frobnicate", f"the unknown field is named: {e.body}")
raises(openai.BadRequestError,
       lambda: client.completions.create(model=MODEL, prompt=["a", "b"]),
       "two prompts")
e = raises(openai.BadRequestError,
           lambda: client.completions.create(model=MODEL, prompt="word " * 5000, max_tokens=1),
           "a prompt over the context")
check(e.code == "context_length_exceeded", f"context error code: {e.code}")
raises(openai.AuthenticationError,
       lambda: OpenAI(base_url=BASE + "/v1", api_key="wrong", max_retries=0).models.list(),
       "wrong API key")

# A full queue: 429 while a generation runs.
stream = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=200, temperature=0,
                                   stream=True)
first = next(iter(stream))
check(first.choices[0].text is not None, "the long stream started")
raises(openai.RateLimitError,
       lambda: client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1),
       "busy server")
stream.close()

# The server still answers afterwards (the closed stream freed its sequence).
ok = threading.Event()
for _ in range(50):
    try:
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1)
        ok.set()
        break
    except openai.RateLimitError:
        threading.Event().wait(0.1)
check(ok.is_set(), "answers after a closed stream")

print(f"openai client {openai.__version__}: {checks} checks passed")
