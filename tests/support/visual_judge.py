"""A scripted vision judge for Visual tests: scores screenshots by simple image statistics.

Plugged into tests/support/fake_judge.FakeJudge as its ``responder``: it
decodes the image content part of the request (the real OpenAI chat
format, a ``data:image/...;base64`` URL) and answers the seven rubric keys
from deterministic statistics of the pixels, so tests are reproducible
and a blank page scores lower than a designed one:

* ink: share of pixels that differ clearly from the page's most common colour;
* colours: distinct colours after coarse quantisation (saturating at 24);
* contrast: grey-level standard deviation (saturating at 64).

Also usable standalone for the demo: ``python -m tests.support.visual_judge``.
"""

from __future__ import annotations

import base64
import io
import json

from tests.support.fake_judge import FakeJudge, Reply, Request


def image_from_request(body) -> bytes:
    for message in (body or {}).get("messages", []):
        content = message.get("content")
        if isinstance(content, list):
            for part in content:
                if part.get("type") == "image_url":
                    url = part["image_url"]["url"]
                    return base64.b64decode(url.split(",", 1)[1])
    raise ValueError("no image in the request")


def statistics(data: bytes) -> dict:
    from PIL import Image, ImageStat

    with Image.open(io.BytesIO(data)) as im:
        small = im.convert("RGB").resize((144, max(1, im.height * 144 // im.width)))
    raw = small.tobytes()
    pixels = [tuple(raw[i:i + 3]) for i in range(0, len(raw), 3)]
    quant = [(r >> 5, g >> 5, b >> 5) for r, g, b in pixels]
    common = max(set(quant), key=quant.count)
    ink = sum(1 for q in quant if q != common) / len(quant)
    colours = len(set(quant))
    contrast = ImageStat.Stat(small.convert("L")).stddev[0]
    return {"ink": ink, "colours": colours, "contrast": contrast}


def verdict(data: bytes) -> dict:
    s = statistics(data)
    ink = min(1.0, s["ink"] / 0.5)
    colours = min(1.0, s["colours"] / 24)
    contrast = min(1.0, s["contrast"] / 64)
    base = round((ink + colours + contrast) / 3, 4)
    return {"layout_integrity": base, "typography_hierarchy": round(contrast, 4),
            "color_harmony": round(colours, 4), "whitespace": base,
            "content_richness": round(ink, 4), "query_fulfillment": base,
            "premium_assets": round(min(0.6, colours), 4),
            "reason": f"ink {s['ink']:.3f}, colours {s['colours']}, contrast {s['contrast']:.1f}"}


def responder(request: Request) -> Reply:
    try:
        return Reply(text=json.dumps(verdict(image_from_request(request.body))))
    except Exception as exc:  # a test that sends no image sees an unparseable verdict
        return Reply(text=f"cannot score: {exc}")


def scripted_judge() -> FakeJudge:
    return FakeJudge(responder=responder)


def main() -> None:
    import time
    judge = scripted_judge().start()
    print(judge.url, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        judge.stop()


if __name__ == "__main__":
    main()
