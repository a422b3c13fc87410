"""Time to first token with one image: each PNG sent alone, in turn, as a
data URL in a chat request for one token (so the image's encoding is in
every request, none cached), to a server on 127.0.0.1:PORT (wick or
llama-server: both speak the chat API). With --together, one request per
PNG, all at once: the wall time for all of them, images per minute, and
their times to first token. Give each run PNGs the server has not seen:
a server may keep an image's encoding.

    python3 scripts/image_ttft.py PORT IMAGE.png ... [--together]
"""
import base64, json, sys, time, urllib.request
from concurrent.futures import ThreadPoolExecutor

args = sys.argv[1:]
together = "--together" in args
port, imgs = args[0], [a for a in args[1:] if a != "--together"]


def ask(img):
    b64 = base64.b64encode(open(img, 'rb').read()).decode()
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Describe this picture."},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64}"}}]}],
            "max_tokens": 1, "temperature": 0}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    t = time.time()
    out = json.load(urllib.request.urlopen(req, timeout=1800))
    return time.time() - t, out["usage"]


if together:
    t = time.time()
    with ThreadPoolExecutor(len(imgs)) as pool:
        results = list(pool.map(ask, imgs))
    wall = time.time() - t
    ttfts = sorted(r[0] for r in results)
    print(f"{len(imgs)} at once: {wall:.2f} s, {60 * len(imgs) / wall:.2f} images/min, "
          f"time to first token {ttfts[0]:.2f}-{ttfts[-1]:.2f} s, "
          f"mean {sum(ttfts) / len(ttfts):.2f} s")
else:
    for img in imgs:
        secs, usage = ask(img)
        print(img, f"{secs:.2f} s", usage)
