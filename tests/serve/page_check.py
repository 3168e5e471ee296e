"""Loads the chat page in headless Chromium and waits until its scripted message is answered.

Usage: page_check.py CHROMIUM URL PROFILE_DIR TIMEOUT_S
The URL carries `?q=...` so the page sends a message on load and writes the outcome to
<pre id="result"> as JSON. Chromium is driven over the DevTools protocol on a pipe
(--remote-debugging-pipe: NUL-separated JSON on file descriptors 3 and 4), polling the page
until the result is there. Prints one JSON object: the page's result, the reply text shown in
the conversation and its state. Exits 1 on timeout.
"""

import json
import os
import subprocess
import sys
import time

chrome, url, profile, timeout_s = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])

to_chrome_r, to_chrome_w = os.pipe()
from_chrome_r, from_chrome_w = os.pipe()


def child_fds():
    # Chromium reads commands from fd 3 and writes answers to fd 4. Copies first, so neither
    # end is overwritten before it is moved; dup2 onto itself would keep close-on-exec.
    a, b = os.dup(to_chrome_r), os.dup(from_chrome_w)
    os.dup2(a, 3)
    os.dup2(b, 4)
    os.set_inheritable(3, True)
    os.set_inheritable(4, True)


proc = subprocess.Popen(
    [chrome, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
     "--no-first-run", "--remote-debugging-pipe", f"--user-data-dir={profile}", "about:blank"],
    close_fds=False, preexec_fn=child_fds,
    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
)
os.close(to_chrome_r)
os.close(from_chrome_w)
inbox = b""
next_id = 0


def call(method, params=None, session=None):
    """Sends a command and returns its result (events in between are skipped)."""
    global inbox, next_id
    next_id += 1
    msg = {"id": next_id, "method": method, "params": params or {}}
    if session:
        msg["sessionId"] = session
    os.write(to_chrome_w, json.dumps(msg).encode() + b"\0")
    while True:
        while b"\0" not in inbox:
            chunk = os.read(from_chrome_r, 1 << 16)
            if not chunk:
                raise RuntimeError("chromium closed the pipe")
            inbox += chunk
        raw, inbox = inbox.split(b"\0", 1)
        reply = json.loads(raw)
        if reply.get("id") == next_id:
            if "error" in reply:
                raise RuntimeError(f"{method}: {reply['error']}")
            return reply["result"]


try:
    target = call("Target.createTarget", {"url": url})["targetId"]
    session = call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    probe = """JSON.stringify({
        result: (document.getElementById('result') || {}).textContent || '',
        reply: Array.from(document.querySelectorAll('.msg.assistant .content, .msg.error .content'))
                 .map(e => e.textContent).join('\\n'),
        state: Array.from(document.querySelectorAll('.msg')).map(e => e.dataset.state || '').join(','),
        user: Array.from(document.querySelectorAll('.msg.user .content')).map(e => e.textContent),
    })"""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            r = call("Runtime.evaluate", {"expression": probe, "returnByValue": True}, session)
            seen = json.loads(r["result"]["value"])
        except (RuntimeError, KeyError) as e:
            # The page may be between documents while it loads.
            if "closed the pipe" in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.1)
            continue
        if seen["result"]:
            seen["result"] = json.loads(seen["result"])
            print(json.dumps(seen))
            sys.exit(0)
        if time.monotonic() > deadline:
            print(json.dumps(seen))
            sys.exit(1)
        time.sleep(0.1)
finally:
    try:
        call("Browser.close")
    except Exception:  # noqa: BLE001 - the browser may already be gone
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
