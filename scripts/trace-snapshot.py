"""Takes a screenshot of one question's trace in Phoenix's UI with headless Chromium (Debian's chromium
and chromedriver, driven over the WebDriver protocol: no Selenium), for docs/operations.md.

    python3 scripts/trace-snapshot.py --phoenix http://127.0.0.1:6006 --trace <trace id> --out trace.png

It opens the trace with the first `main` stage's LLM call selected and its Attributes tab shown (the
GenAI conventions), waits for the page to settle in real time (Chromium's virtual time leaves Phoenix's
trace tree empty), and writes the PNG.
"""

import argparse
import base64
import json
import socket
import subprocess
import time
import urllib.request


def get_json(url):
    with urllib.request.urlopen(url, timeout=30) as reply:
        return json.load(reply)


def llm_call_of_first_main(phoenix, trace):
    """Phoenix's node id of the first LLM call under the first `main` stage span of the trace."""
    spans = get_json(f"{phoenix}/v1/projects/default/spans?limit=1000")["data"]
    spans = [s for s in spans if s["context"]["trace_id"] == trace]
    mains = sorted((s for s in spans if s["name"] == "main"), key=lambda s: s["start_time"])
    if not mains:
        return None
    calls = [s for s in spans if s["parent_id"] == mains[0]["context"]["span_id"] and s["span_kind"] == "LLM"]
    return calls[0]["id"] if calls else None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--phoenix", default="http://127.0.0.1:6006")
    parser.add_argument("--trace", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--size", default="1800,1200")
    parser.add_argument("--settle-s", type=float, default=12)
    args = parser.parse_args()

    project = get_json(f"{args.phoenix}/v1/projects")["data"][0]["id"]
    url = f"{args.phoenix}/projects/{project}/traces/{args.trace}"
    selected = llm_call_of_first_main(args.phoenix, args.trace)
    if selected:
        url += f"?selectedSpanNodeId={selected}"

    port = free_port()
    driver = subprocess.Popen(["chromedriver", f"--port={port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def call(method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method, data=data,
                                         headers={"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as reply:
            return json.load(reply)

    try:
        for _ in range(100):
            try:
                call("GET", "/status")
                break
            except OSError:
                time.sleep(0.1)
        chrome = ["--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--window-size={args.size}"]
        session = call("POST", "/session", {"capabilities": {"alwaysMatch": {"goog:chromeOptions": {"args": chrome}}}})
        sid = session["value"]["sessionId"]
        call("POST", f"/session/{sid}/url", {"url": url})
        time.sleep(args.settle_s)
        if selected:
            show = "[...document.querySelectorAll('[role=tab]')].find(e => e.textContent.trim().startsWith('Attributes'))?.click()"
            call("POST", f"/session/{sid}/execute/sync", {"script": show, "args": []})
            time.sleep(2)
        png = call("GET", f"/session/{sid}/screenshot")["value"]
        with open(args.out, "wb") as f:
            f.write(base64.b64decode(png))
        call("DELETE", f"/session/{sid}")
    finally:
        driver.kill()
    print(f"{args.out}: {url}")


if __name__ == "__main__":
    main()
