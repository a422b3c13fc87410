"""Time to first token with one image: each PNG sent alone, in turn, as a
data URL in a chat request for one token (so the image's encoding is in
every request, none cached), to a server on 127.0.0.1:PORT (wick or
llama-server: both speak the chat API).

    python3 scripts/image_ttft.py PORT IMAGE.png ...
"""
import base64, json, sys, time, urllib.request
port, imgs = sys.argv[1], sys.argv[2:]
for img in imgs:
    b64 = base64.b64encode(open(img, 'rb').read()).decode()
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Describe this picture."},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64}"}}]}],
            "max_tokens": 1, "temperature": 0}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    t = time.time()
    out = json.load(urllib.request.urlopen(req, timeout=900))
    print(img, f"{time.time()-t:.2f} s", out["usage"])
