"""Take one screenshot of a delivered site. Runs INSIDE the renderer sandbox.

This file is copied into the renderer sandbox and run there with the
rootfs's own python3 (Playwright on PYTHONPATH); the service never imports
it. Standard library + Playwright only.

The procedure is upstream's eval render (MiMo's webdev shot, as NeMo-Gym's
``webdev_eval_v1`` runs it): dist/ served on a loopback HTTP server, one
headless Chromium context at 1440x900, ``load`` (25 s) + 2 s, a settle
pass that scrolls through the page, a stylesheet freezing animations and
transitions, back to the top, one full-page JPEG at quality 75.

What differs: the sandbox has no network but loopback. Requests to the
allowlisted CDN URLs are answered from the local mirror (``mirror`` in the
job: URL -> file); every other non-loopback request is aborted before any
name is resolved and listed in ``blocked``: the page is shot without it
(the delivery contract says other external URLs will not load). A page
taller than MAX_HEIGHT is shot down to that height (``clipped_from`` its
full height): a 65 000 px page is not a screenshot any judge reads. Chromium
refuses ``file:`` loads from the page's http origin itself (they never reach
a route); its console line naming each is kept in ``local_loads``, and
WebSockets (not routed) opened beyond the origin in ``sockets``: the
service's integrity verdict reads both.

Job (JSON file, argv[1]): dist, out, browser, mirror, goto_timeout_ms.
Result: one JSON line on stdout.
"""

import functools
import http.server
import json
import re
import sys
import threading
import time
import urllib.parse  # noqa: F401  # the sandbox script's imports stay as shipped

VIEWPORT = {"width": 1440, "height": 900}
#: the tallest shot taken (CSS px); 1440 x 16384 is already above the 20 MP
#: the service downscales to
MAX_HEIGHT = 16384
FREEZE_CSS = """
*, *::before, *::after {
  animation-duration: 0.001s !important; animation-delay: 0s !important;
  animation-iteration-count: 1 !important;
  transition-duration: 0.001s !important; transition-delay: 0s !important;
  background-attachment: scroll !important; caret-color: transparent !important;
}
html { scroll-behavior: auto !important; }
"""
SETTLE_JS = """
async () => {
  document.documentElement.style.scrollBehavior = 'auto';
  try { await document.fonts.ready; } catch (e) {}
  const sleep = (ms) => new Promise(r => setTimeout(r, ms));
  const step = Math.max(400, Math.floor(window.innerHeight * 0.8));
  for (let y = 0; y < 30000; y += step) {
    window.scrollTo(0, y);
    await sleep(120);
    if (y + window.innerHeight >= document.documentElement.scrollHeight) break;
  }
  window.scrollTo(0, document.documentElement.scrollHeight);
  await sleep(400);
  window.scrollTo(0, 0);
  await sleep(300);
}
"""

# The text the page shows, for the service's screen of text addressing the
# judge (delivery.judge_findings): a vision judge reads the screenshot's
# text, so text written into it is an instruction channel. Read from the
# browser's layout tree (CDP DOMSnapshot: every frame, CSS generated content
# and SVG text included, faint or tiny text too since a model may still read
# it; page scripts cannot intercept it), plus input values, placeholders,
# alt texts, and the strings the page drew on 2D canvases (CANVAS_HOOK, set
# before any page script). Also what is written for a reader but not drawn
# (the <title>, aria-label and title attributes, <noscript>): not in the
# screenshot, but a page that writes there to its evaluator is talking to
# it all the same, and the service's screen reads it. Not seen: text baked into an image, or drawn
# with a canvas method the page took from a realm the hook did not reach;
# the rubric's own rule is what remains against those.
TEXT_LIMIT = 65536
CANVAS_HOOK = """
(() => {
  const seen = [], push = Array.prototype.push, join = Array.prototype.join;
  const apply = Reflect.apply, text = String;
  for (const proto of [window.CanvasRenderingContext2D, window.OffscreenCanvasRenderingContext2D]) {
    if (!proto) continue;
    for (const name of ['fillText', 'strokeText']) {
      const original = proto.prototype[name];
      Object.defineProperty(proto.prototype, name, {value: function (...args) {
        if (seen.length < 2000) apply(push, seen, [text(args[0]).slice(0, 500)]);
        return apply(original, this, args);
      }});
    }
  }
  // read only through this closure: the page cannot empty or replace it
  Object.defineProperty(window, '__camgCanvasText', {value: () => apply(join, seen, ['\\n'])});
})();
"""
_SHOWN_ATTRIBUTES = ("placeholder", "alt", "value", "aria-label", "aria-description", "title")
#: elements whose text is written for a reader but never laid out
_UNDRAWN = ("TITLE", "NOSCRIPT")


def _page_text(context, page):
    """What the page shows as text (see above), at most TEXT_LIMIT characters."""
    cdp = context.new_cdp_session(page)
    try:
        snap = cdp.send("DOMSnapshot.captureSnapshot", {"computedStyles": []})
    finally:
        cdp.detach()
    strings, out = snap["strings"], []
    for doc in snap["documents"]:
        out += [strings[i] for i in doc["layout"]["text"] if i >= 0]
        nodes = doc["nodes"]
        for attrs in nodes.get("attributes", []):
            out += [
                strings[attrs[k + 1]]
                for k in range(0, len(attrs) - 1, 2)
                if strings[attrs[k]].lower() in _SHOWN_ATTRIBUTES
            ]
        for key in ("inputValue", "textValue"):
            out += [strings[i] for i in (nodes.get(key) or {}).get("value", []) if i >= 0]
        names, values = nodes.get("nodeName", []), nodes.get("nodeValue", [])
        for i, parent in enumerate(nodes.get("parentIndex", [])):
            if (
                parent >= 0
                and i < len(values)
                and values[i] >= 0
                and strings[names[parent]].upper() in _UNDRAWN
            ):
                out.append(strings[values[i]])
    try:
        out.append(page.evaluate("() => window.__camgCanvasText ? window.__camgCanvasText() : ''"))
    except Exception:  # the DOM text above still stands
        pass
    return "\n".join(t for t in out if t and t.strip())[:TEXT_LIMIT]


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def _serve(root):
    handler = functools.partial(_Quiet, directory=root)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _content_type(path):
    if path.endswith(".css"):
        return "text/css; charset=utf-8"
    if path.endswith((".woff2", ".woff")):
        return "font/" + path.rsplit(".", 1)[1]
    return "application/javascript; charset=utf-8"


def _jpeg_size(data):
    i = 2
    while i < len(data):
        if data[i] != 0xFF:
            i += 1
            continue
        marker = data[i + 1]
        if marker in (0xC0, 0xC1, 0xC2):
            return int.from_bytes(data[i + 7 : i + 9], "big"), int.from_bytes(
                data[i + 5 : i + 7], "big"
            )
        i += 2 + int.from_bytes(data[i + 2 : i + 4], "big")
    return 0, 0


def render(job):
    from playwright.sync_api import sync_playwright

    timings = {}
    started = time.monotonic()
    server = _serve(job["dist"])
    origin = f"http://127.0.0.1:{server.server_address[1]:d}"
    mirror = job.get("mirror", {})
    blocked: list[str] = []
    console: list[str] = []
    local: list[str] = []
    sockets: list[str] = []
    # Chromium's refusals of file: URLs (element, navigation, fetch, XHR)
    refused_local = re.compile(
        r"(?:Not allowed to load local resource: |cannot load |"
        r"XMLHttpRequest at ')(file:[^\s'\"]+)"
    )

    def on_console(message):
        text = message.text
        hit = refused_local.search(text)
        if hit and len(local) < 50:
            local.append(hit.group(1).rstrip(".")[:500])
        if message.type == "error" and len(console) < 15:
            console.append(text[:500])

    def on_page_error(error):
        if len(console) < 15:
            console.append(str(error)[:500])

    def on_socket(ws):
        if not ws.url.startswith(origin.replace("http", "ws", 1) + "/") and len(sockets) < 50:
            sockets.append(ws.url[:500])

    def route(r):
        url = r.request.url
        if url.startswith(origin + "/") or url == origin:
            return r.continue_()
        if url in mirror:
            with open(mirror[url], "rb") as f:
                return r.fulfill(
                    status=200,
                    body=f.read(),
                    content_type=_content_type(mirror[url]),
                    headers={"Access-Control-Allow-Origin": "*"},
                )
        if len(blocked) < 50:
            blocked.append(url)
        return r.abort("blockedbyclient")

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=job["browser"],
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-dev-shm-usage",
                "--disable-gpu",
                "--font-render-hinting=none",
            ],
        )
        timings["launch"] = round(time.monotonic() - started, 3)
        try:
            context = browser.new_context(
                viewport=VIEWPORT,  # type: ignore[arg-type]  # a ViewportSize; naming it would add an import here
                device_scale_factor=1,
                service_workers="block",
            )
            context.route("**/*", route)
            context.add_init_script(CANVAS_HOOK)
            page = context.new_page()
            page.on("console", on_console)
            page.on("websocket", on_socket)
            page.on("pageerror", on_page_error)
            page.goto(
                origin + "/index.html", wait_until="load", timeout=job.get("goto_timeout_ms", 25000)
            )
            page.wait_for_timeout(2000)
            page.evaluate(SETTLE_JS)
            page.add_style_tag(content=FREEZE_CSS)
            page.wait_for_timeout(300)
            page.evaluate("() => window.scrollTo(0, 0)")
            page.wait_for_timeout(250)
            cdp = context.new_cdp_session(page)
            try:
                page_height = cdp.send("Page.getLayoutMetrics")["cssContentSize"]["height"]
            finally:
                cdp.detach()
            data = page.screenshot(
                full_page=True,
                type="jpeg",
                quality=75,
                animations="disabled",
                caret="hide",
                # trimmed to the page: only the height is bounded
                clip={"x": 0, "y": 0, "width": MAX_HEIGHT, "height": MAX_HEIGHT},
            )
            text = _page_text(context, page)
            timings["total"] = round(time.monotonic() - started, 3)
        finally:
            browser.close()
            server.shutdown()
    with open(job["out"], "wb") as f:
        f.write(data)
    width, height = _jpeg_size(data)
    return {
        "ok": True,
        "width": width,
        "height": height,
        "bytes": len(data),
        "blocked": blocked,
        "console_errors": console,
        "local_loads": local,
        "sockets": sockets,
        "text": text,
        "timings": timings,
        "clipped_from": int(page_height) if page_height > MAX_HEIGHT else 0,
    }


def main():
    with open(sys.argv[1]) as f:
        job = json.load(f)
    try:
        result = render(job)
    except Exception as exc:  # reported as a typed failure by the service
        result = {"ok": False, "error": type(exc).__name__, "message": str(exc)[:2000]}
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
