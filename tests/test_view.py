"""``jailbox view`` in a real headless Chromium: a real run (a real jail, a scripted model) with an image it
made, a real batch with mixed outcomes, a real replay, two runs compared, the export; and what a model or a
jail chose (HTML, script and SVG in observations, file names and produced files, links out of the output
directory) never runs and never reaches outside. Screenshots show what is on screen."""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import pytest
from conftest import SHARED_DATA, need, require
from support import browser
from support.cli import JAILBOX
from support.llm_server import ScriptedServer, Step, error, reply
from support.waits import wait_until

from jailbox.agent.tasks import TaskResult
from jailbox.agent.trajectory import load as load_trajectory
from jailbox.agent.view.sources import MAX_RECORD

ROOT = Path(__file__).resolve().parent.parent
PNG_SIZE = (24, 16)
TITLE = "jailbox view"
BOX = "const r = arguments[0].getBoundingClientRect(); return [r.x, r.y, r.width, r.height]"


def png(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    row = b"\x00" + bytes(rgb) * width

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(row * height))
        + chunk(b"IEND", b"")
    )


def wav(seconds: float, rate: int = 8000) -> bytes:
    """A mono 8-bit PCM WAV of a square wave."""
    samples = bytes(200 if (i // 10) % 2 else 56 for i in range(int(seconds * rate)))
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate, 1, 8)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(samples)) + samples
    return b"RIFF" + struct.pack("<I", len(body)) + body


class Canary:
    """A server on loopback that counts every request: a payload that loads or beacons anything hits it."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        canary = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                canary.hits.append(self.path)
                self.send_response(204)
                self.end_headers()

            do_POST = do_GET

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def canary() -> Iterator[Canary]:
    c = Canary()
    yield c
    c.close()


def payloads(canary: Canary, where: str) -> str:
    """Markup that, were it run, would change the title, set a global, or reach the canary."""
    return (
        f"<script>document.title='pwned-{where}';fetch('{canary.url}/fetch-{where}')</script>"
        f"<img src='{canary.url}/img-{where}' onerror=\"document.title='pwned-{where}'\">"
        f"<svg onload=\"navigator.sendBeacon('{canary.url}/beacon-{where}')\"></svg>"
    )


HOSTILE_NAME = "<img src=x onerror=document.title='pwned-name'>.html"


def _model(canary: Canary) -> Any:
    """A scripted model: draws a PNG and hostile files in the output directory, edits a file, answers, submits."""
    image = base64.b64encode(png(*PNG_SIZE, (220, 20, 20))).decode()
    hostile = payloads(canary, "observation").replace("'", "'\\''")
    commands = [
        f"printf %s {image} | base64 -d > /testbed/output/plot.png && printf '%s' '{hostile}' "
        f"&& printf '%s' '{hostile}' > /testbed/output/page.html && cp /testbed/output/page.html "
        f'"/testbed/output/{HOSTILE_NAME}" && printf \'%s\' \'<svg xmlns="http://www.w3.org/2000/svg" '
        f'onload="document.title=1"><script>document.title=2</script></svg>\' > /testbed/output/evil.svg',
        None,  # the editor
        f"printf '%s' '{hostile}' > /testbed/output/answer.txt; date +%s%N",
    ]

    def respond(request: dict) -> Step:
        done = sum(1 for m in request["messages"] if m["role"] == "tool")
        if done == 1:
            arguments = {"command": "create", "path": "/testbed/output/notes.txt", "file_text": "line one\nline two\n"}
            name = "str_replace_editor"
        elif done < len(commands):
            arguments, name = {"command": commands[done]}, "execute_bash"
        else:
            arguments, name = {}, "submit"
        call = {"id": f"c{done}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
        thought = f"Step {done}: " + payloads(canary, "thought")
        return reply(
            thought, tool_calls=[call], finish_reason="tool_calls", usage={"prompt_tokens": 100, "completion_tokens": 7}
        )

    return respond


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory, canary: Canary) -> dict[str, Path]:
    """A real run, a real batch and a real replay, recorded once for the module's tests."""
    base = tmp_path_factory.mktemp("view")
    with ScriptedServer(responder=_model(canary)) as server:
        copy = ["plot.png", "page.html", HOSTILE_NAME, "evil.svg", "notes.txt"]
        flags = [f"--copy-out={name}" for name in copy]
        ran = subprocess.run(
            [
                *JAILBOX,
                "run",
                "--query",
                "Draw a red square. " + payloads(canary, "task"),
                "--llm_name",
                "m",
                "--llm_base_url",
                server.url,
                "--api_key",
                "k",
                "--network",
                "none",
                "--output_dir",
                str(base / "runs"),
                "--json",
                *flags,
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert ran.returncode == 0, ran.stderr
    run = Path(json.loads(ran.stdout)["output_dir"])
    (run / "files" / "passwd").symlink_to("/etc/passwd")  # links left by anyone: never followed
    (run / "files" / "up").symlink_to("/etc")
    (run / "secret-outside").write_text("not this")  # only for the symlinked-parent check below
    replayed = subprocess.run(
        [*JAILBOX, "replay", str(run / "trajectory.json"), "--network", "none", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert replayed.returncode in (0, 1), replayed.stderr
    (base / "replay").mkdir()
    (base / "replay" / "replay.json").write_text(replayed.stdout)
    return {"run": run, "runs": base / "runs", "replay": base / "replay" / "replay.json", "base": base}


def _batch_model(request: dict) -> Step:
    task = request["messages"][1]["content"]
    if "BROKEN" in task:
        return error(500, "the endpoint is down")
    answer = "4" if "RIGHT" in task else "5"
    if request["messages"][-1]["role"] == "tool":
        call = {"id": "s", "type": "function", "function": {"name": "submit", "arguments": "{}"}}
    else:
        command = json.dumps({"command": f"echo {answer} > /testbed/output/answer.txt"})
        call = {"id": "c", "type": "function", "function": {"name": "execute_bash", "arguments": command}}
    return reply("working", tool_calls=[call], finish_reason="tool_calls", usage={"total_tokens": 11})


@pytest.fixture(scope="module")
def batch(tmp_path_factory: pytest.TempPathFactory, canary: Canary) -> Path:
    base = tmp_path_factory.mktemp("batch")
    tasks = [
        {"id": "right", "query": "RIGHT: what is 2+2?", "answer": "4", "domain": "math"},
        {"id": "wrong", "query": "WRONG: what is 2+2?", "answer": "4", "domain": "math"},
        {"id": "<b>broken</b>" + payloads(canary, "id"), "query": "BROKEN", "answer": "4", "domain": "<i>code</i>"},
    ]
    (base / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    with ScriptedServer(responder=_batch_model) as server:
        ran = subprocess.run(
            [
                *JAILBOX,
                "bench",
                str(base / "tasks.jsonl"),
                "--llm-name",
                "m",
                "--llm-base-url",
                server.url,
                "--api-key",
                "k",
                "--llm-max-retries",
                "0",
                "--network",
                "none",
                "--workers",
                "3",
                "--output-dir",
                str(base / "out"),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert (base / "out" / "results.jsonl").exists(), ran.stderr
    return base / "out"


@contextmanager
def viewing(*paths: Path | str, port: int = 0) -> Iterator[str]:
    """``jailbox view --no-browser PATHS`` running; the URL it printed."""
    proc = subprocess.Popen(
        [*JAILBOX, "view", "--no-browser", "--port", str(port), *map(str, paths)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found = re.search(r"http://127\.0\.0\.1:\d+/\?token=\S+", line)
        assert found, line + (proc.stderr.read() if proc.stderr else "")
        yield found.group(0)
    finally:
        proc.terminate()
        proc.wait(10)


def fetch(url: str, path: str, host: str | None = None) -> tuple[int, dict[str, str], bytes]:
    """GET ``path`` (with the URL's token unless the path has its own query) from the viewer at ``url``."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    headers = {"Host": host} if host else {}
    conn.request("GET", path, headers=headers)
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, body


def token_of(url: str) -> str:
    return urlsplit(url).query.removeprefix("token=")


@pytest.fixture(scope="module")
def chrome() -> Iterator[Any]:
    require(browser.available(), "Chromium and its driver for selenium", browser.FIX)
    with browser.chromium() as driver:
        yield driver


def _untouched(driver: Any, canary: Canary) -> None:
    """Nothing a record held ran: the title is the viewer's, and nothing reached the canary."""
    time.sleep(0.3)  # a beacon or image load would have landed by now
    assert driver.title.endswith(TITLE), driver.title  # a payload would have set it whole: 'pwned-...'
    assert canary.hits == [], canary.hits
    assert driver.execute_script("return window.pwned === undefined")


def follow(driver: Any, element: Any) -> None:
    """Click a link or a submit button and wait for the page it leads to (a click does not wait)."""
    before = driver.current_url
    element.click()
    wait_until(
        lambda: driver.current_url != before and driver.execute_script("return document.readyState") == "complete",
        "the next page",
        10,
    )


def _shot(driver: Any, where: Path, name: str) -> None:
    """The page as shown, kept for docs/view.png when ``JAILBOX_VIEW_SHOTS`` names a folder (no test reads it)."""
    if os.environ.get("JAILBOX_VIEW_SHOTS"):
        path = where / f"{name}.png"
        driver.save_screenshot(str(path))
        shutil.copy(path, Path(os.environ["JAILBOX_VIEW_SHOTS"]) / path.name)


def _color_at_centre(driver: Any, element: Any) -> tuple[int, ...]:
    """The colour Chromium renders at the centre of ``element``'s box: a one-pixel screenshot there (the
    clip is in page coordinates: the box's, which are the viewport's, plus the scroll)."""
    x, y, width, height = driver.execute_script(BOX, element)
    scroll_x, scroll_y = driver.execute_script("return [window.scrollX, window.scrollY]")
    centre = {"x": scroll_x + int(x + width / 2), "y": scroll_y + int(y + height / 2)}
    clip = {**centre, "width": 1, "height": 1, "scale": 1}
    shot = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png", "clip": clip})
    one_wide, one_high, [pixel] = browser.pixels(base64.b64decode(shot["data"]))
    assert (one_wide, one_high) == (1, 1)
    return pixel


@pytest.mark.slow
def test_a_run_shows_its_steps_its_image_and_its_files(
    chrome: Any, outputs: dict[str, Path], canary: Canary, tmp_path: Path
):
    trajectory = load_trajectory(outputs["run"] / "trajectory.json")
    with viewing(outputs["run"]) as url:
        chrome.get(url)
        chrome.find_element("css selector", "li.step")
        _shot(chrome, tmp_path, "run")
        steps = chrome.find_elements("css selector", "li.step")
        assert len(steps) == len(trajectory.steps) == 4
        image = chrome.find_element("css selector", "img.produced")
        assert chrome.execute_script(
            "return [arguments[0].complete, arguments[0].naturalWidth, arguments[0].naturalHeight]", image
        ) == [True, *PNG_SIZE]
        # the image is on screen: its box in the screenshot is the red the model drew
        chrome.execute_script("arguments[0].scrollIntoView()", image)
        _shot(chrome, tmp_path, "run-image")
        red = _color_at_centre(chrome, image)
        assert red[0] > 200 and red[1] < 60 and red[2] < 60, red
        text = chrome.find_element("tag name", "main").text
        assert "execute_bash" in text and "str_replace_editor" in text
        assert "+line one" in text  # the editor's create, as a diff
        assert payloads(canary, "observation") in text  # a hostile observation is shown as the text it is
        assert HOSTILE_NAME in text and "a symlink: not followed" in text
        assert "tokens 100 in, 7 out" in text
        _untouched(chrome, canary)


@pytest.mark.slow
def test_produced_files_never_run_as_pages(chrome: Any, outputs: dict[str, Path], canary: Canary):
    with viewing(outputs["run"]) as url:
        token = token_of(url)
        for name in ("page.html", "evil.svg", HOSTILE_NAME, "notes.txt"):
            status, headers, body = fetch(url, f"/file?s=0&p={quote('files/' + name, safe='')}&token={token}")
            assert status == 200
            assert headers["content-type"] == "application/octet-stream"
            assert headers["content-disposition"].startswith("attachment;")
            assert headers["x-content-type-options"] == "nosniff"
            assert headers["content-security-policy"].startswith("sandbox;")
        status, headers, body = fetch(url, f"/?token={token}")  # the pages: only the viewer's own script
        policy = headers["content-security-policy"]
        assert status == 200 and "script-src 'self';" in policy and "default-src 'none'" in policy
        assert "unsafe" not in policy and "http" not in policy and headers["x-content-type-options"] == "nosniff"
        status, headers, body = fetch(url, f"/file?s=0&p=files%2Fplot.png&token={token}")
        assert (status, headers["content-type"]) == (200, "image/png") and body == png(*PNG_SIZE, (220, 20, 20))
        # opened in the browser anyway: an attachment (downloaded) or a text view, nothing runs
        chrome.get(f"{url.split('?')[0]}text?s=0&p={quote('files/' + HOSTILE_NAME, safe='')}&token={token}")
        assert "<script>" in chrome.find_element("css selector", "pre.textfile").text
        _untouched(chrome, canary)
        chrome.get(f"{url.split('?')[0]}file?s=0&p=files%2Fevil.svg&token={token}")
        _untouched_title = chrome.execute_script("return document.title")
        assert "1" != _untouched_title != "2"
        assert canary.hits == []


@pytest.mark.slow
def test_nothing_outside_the_output_directories_is_served(outputs: dict[str, Path]):
    with viewing(outputs["run"]) as url:
        token = token_of(url)
        for rel in (
            "../secret-outside",
            "files/../../../etc/passwd",
            "/etc/passwd",
            "files/passwd",
            "files/up/passwd",
            "files/up",
            "files",
            "..",
            "",
            "files/./plot.png",
            "files//plot.png",
        ):
            for route in ("file", "text"):
                status, _, body = fetch(url, f"/{route}?s=0&p={quote(rel, safe='')}&token={token}")
                assert status == 404, (route, rel, status)
                assert b"root:" not in body
        wrong = token[:-1] + ("x" if token[-1] != "x" else "y")  # one character off (a token may end in x)
        for query in ("", "token=", "token=" + wrong, "token=" + token + "x"):
            status, _, body = fetch(url, f"/file?s=0&p=files%2Fplot.png&{query}")
            assert status == 403 and b"PNG" not in body
        status, _, _ = fetch(url, f"/?token={token}", host="evil.example:80")  # a DNS-rebound page
        assert status == 403
        status, _, _ = fetch(url, f"/file?s=7&p=files%2Fplot.png&token={token}")
        assert status == 404


@pytest.mark.slow
def test_links_fifos_odd_names_and_large_files(chrome: Any, outputs: dict[str, Path], tmp_path: Path):
    """A run directory someone tampered with: its record a link out, a FIFO, a name that is not UTF-8, a file
    larger than a page shows; each is refused or shown in part, and nothing waits on the FIFO."""
    run = tmp_path / "run"
    shutil.copytree(outputs["run"], run, symlinks=True)
    os.mkfifo(run / "files" / "fifo")
    (run / "files" / os.fsdecode(b"odd-\xff\xfe.txt")).write_bytes(b"odd bytes")
    (run / "files" / "big.txt").write_bytes(b"x" * (1 << 20) + b"THE-END")
    (run / "files" / "tone.wav").write_bytes(wav(0.5))
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "trajectory.json").symlink_to(run / "trajectory.json")
    huge = tmp_path / "huge"
    huge.mkdir()
    with (huge / "trajectory.json").open("wb") as f:
        f.truncate(MAX_RECORD + 1)  # sparse: costs the disk nothing
    with viewing(run, linked, huge) as url:
        token = token_of(url)
        status, _, body = fetch(url, f"/file?s=0&p=files%2Ffifo&token={token}")
        assert status == 404 and b"not a regular file" in body
        status, headers, body = fetch(url, f"/file?s=0&p=files%2Fodd-%FF%FE.txt&token={token}")
        assert (status, body) == (200, b"odd bytes") and "odd-" in headers["content-disposition"]
        status, _, body = fetch(url, f"/text?s=0&p=files%2Fbig.txt&token={token}")
        assert status == 200 and b"THE-END" not in body and b"1,048,583 bytes, the first 262,144 shown" in body
        status, _, body = fetch(url, f"/file?s=0&p=files%2Fbig.txt&token={token}")
        assert status == 200 and body.endswith(b"THE-END")  # a download is the whole file
        status, _, body = fetch(url, f"/source?s=1&token={token}")
        assert status == 404 and b"a symlink, which is not followed" in body
        status, _, body = fetch(url, f"/source?s=2&token={token}")
        assert status == 404 and f"{MAX_RECORD + 1} bytes, past the viewer".encode() in body
        chrome.get(url)
        follow(chrome, chrome.find_element("partial link text", "/run"))
        text = chrome.find_element("tag name", "main").text
        assert "files/fifo" in text and "not a regular file" in text and "odd-\\xff\\xfe.txt" in text
        audio = chrome.find_element("css selector", "audio")
        wait_until(lambda: chrome.execute_script("return arguments[0].readyState", audio) >= 1, "the WAV's header", 10)
        assert abs(chrome.execute_script("return arguments[0].duration", audio) - 0.5) < 0.01  # playable


@pytest.mark.slow
def test_a_batch_with_mixed_outcomes(chrome: Any, batch: Path, canary: Canary, tmp_path: Path):
    results = [json.loads(line) for line in (batch / "results.jsonl").read_text().splitlines()]
    assert sorted(r["exit_status"] for r in results) == ["llm_error", "submitted", "submitted"]
    with viewing(batch) as url:
        chrome.get(url)
        chrome.find_element("css selector", "table#batch")
        bar = next(r for r in chrome.find_elements("css selector", "svg.plot rect") if r.size["width"] > 4)
        _shot(chrome, tmp_path, "batch")
        assert _color_at_centre(chrome, bar)[:3] == (0x4A, 0x7B, 0xD0)  # a bar
        rows = chrome.find_elements("css selector", "table#batch tbody tr")
        assert len(rows) == 3
        outcomes = sorted(r.get_attribute("data-outcome") for r in rows)
        assert outcomes == ["infra", "ok", "task"]
        plots = chrome.find_elements("css selector", "svg.plot")
        assert len(plots) == 4 and all(p.size["width"] > 100 for p in plots)
        assert chrome.find_elements("css selector", "svg.plot rect")
        assert "<b>broken</b>" in chrome.find_element("id", "batch").text  # a hostile id, shown as text
        # filter: infrastructure failures only
        from selenium.webdriver.support.ui import Select

        Select(chrome.find_element("id", "outcome")).select_by_value("infra")
        visible = [r for r in rows if r.is_displayed()]
        assert [r.get_attribute("data-status") for r in visible] == ["llm_error"]
        Select(chrome.find_element("id", "outcome")).select_by_value("")
        # sort by score, highest first
        chrome.find_element("xpath", "//table[@id='batch']//th[text()='score']").click()
        ids = [
            r.find_elements("tag name", "td")[0].text
            for r in chrome.find_elements("css selector", "table#batch tbody tr")
        ]
        assert ids[0] == "right"
        # a task's run, from its row
        follow(chrome, chrome.find_element("link text", "right"))
        assert len(chrome.find_elements("css selector", "li.step")) == 2
        _untouched(chrome, canary)


@pytest.mark.slow
def test_a_batch_still_running_updates_live(chrome: Any, batch: Path, canary: Canary, tmp_path: Path):
    live = tmp_path / "live"
    shutil.copytree(batch, live)
    lines = (batch / "results.jsonl").read_text().splitlines(keepends=True)
    (live / "results.jsonl").write_text(lines[0])
    with viewing(live) as url:
        chrome.get(url)
        running = chrome.find_elements("css selector", "table#batch tbody tr[data-outcome=running]")
        assert len(running) == 2  # task directories with a trajectory and no result yet
        with (live / "results.jsonl").open("a") as f:
            f.writelines(lines[1:])
        wait_until(
            lambda: not chrome.find_elements("css selector", "table#batch tbody tr[data-outcome=running]"),
            "the page to show the new results (it polls once a second)",
            10,
        )
        assert len(chrome.find_elements("css selector", "table#batch tbody tr")) == 3
        assert not chrome.find_elements("css selector", "table#batch tbody tr[data-outcome=running]")
        assert int(chrome.find_element("id", "live").get_attribute("data-updates")) >= 1
        assert payloads(canary, "id") in chrome.find_element("id", "batch").text  # redrawn, as text
        _untouched(chrome, canary)


@pytest.mark.slow
def test_a_replay_side_by_side(chrome: Any, outputs: dict[str, Path], canary: Canary, tmp_path: Path):
    steps = json.loads(outputs["replay"].read_text())
    beside = tmp_path / "run"  # the replay's JSON in the run's directory: the recorded observations are shown too
    shutil.copytree(outputs["run"], beside, symlinks=True)
    shutil.copy(outputs["replay"], beside / "replay.json")
    recorded = [o for step in load_trajectory(beside / "trajectory.json").steps for o in step.observations]
    with viewing(outputs["replay"], beside / "replay.json") as url:
        chrome.get(url)
        follow(chrome, chrome.find_element("partial link text", "replay.json"))
        chrome.find_element("css selector", "table.replay")
        _shot(chrome, tmp_path, "replay")
        rows = chrome.find_elements("css selector", "table.replay tbody tr")
        assert len(rows) == len(steps) == 4
        verdicts = [r.find_element("css selector", ".badge").text for r in rows]
        assert verdicts == [s["verdict"] for s in steps]
        assert verdicts[2] == "differs"  # the clock moved: the cause is said, the two numbers side by side
        assert steps[2]["cause"] in rows[2].text
        before, now = rows[2].find_elements("css selector", "pre.diff")
        assert before.text != now.text and before.text.split("\n")[-1].isdigit() and now.text.split("\n")[-1].isdigit()
        assert not rows[2].find_elements("css selector", "td.recorded details")  # no trajectory beside this one
        chrome.get(url.replace("/?", "/source?s=1&"))
        rows = chrome.find_elements("css selector", "table.replay tbody tr")
        for summary in rows[2].find_elements("css selector", "summary"):
            summary.click()
        whole_before = rows[2].find_element("css selector", "td.recorded details pre").text
        whole_now = rows[2].find_element("css selector", "td.now details pre").text
        assert whole_before == recorded[2].rstrip("\n") and whole_now == steps[2]["observation"].rstrip("\n")
        assert whole_before != whole_now and "Exit code: 0" in whole_now
        _untouched(chrome, canary)


@pytest.mark.slow
def test_two_runs_compared(chrome: Any, outputs: dict[str, Path], batch: Path, tmp_path: Path):
    from selenium.webdriver.support.ui import Select

    with viewing(outputs["run"], batch) as url:
        token = token_of(url)
        chrome.get(url)  # the index's form: the run, and a batch's task
        Select(chrome.find_element("name", "a")).select_by_index(0)
        Select(chrome.find_element("name", "b")).select_by_visible_text(f"{batch}: right")
        follow(chrome, chrome.find_element("css selector", "form button"))
        rows = chrome.find_elements("css selector", "table.compare tbody tr")
        _shot(chrome, tmp_path, "compare")
        assert len(rows) == 4 and all(r.get_attribute("class") == "differs" for r in rows)
        assert "submitted" in chrome.find_element("css selector", "table.compare thead").text
        chrome.get(f"{url.split('?')[0]}compare?a=0:&b=0:&token={token}")
        assert all(
            r.get_attribute("class") == "same" for r in chrome.find_elements("css selector", "table.compare tbody tr")
        )


@pytest.mark.slow
def test_the_export_is_one_page_without_script(
    chrome: Any, outputs: dict[str, Path], batch: Path, canary: Canary, tmp_path: Path
):
    out = tmp_path / "export.html"
    done = subprocess.run(
        [*JAILBOX, "view", "--export", str(out), str(outputs["runs"]), str(batch), str(outputs["replay"])],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    document = out.read_text()
    assert "<script" not in document.replace("&lt;script", "")
    assert 'http-equiv="Content-Security-Policy"' in document
    chrome.get(out.as_uri())
    _shot(chrome, tmp_path, "export")
    image = chrome.find_element("css selector", "img.produced")
    assert chrome.execute_script("return arguments[0].naturalWidth", image) == PNG_SIZE[0]
    assert len(chrome.find_elements("css selector", "svg.plot")) == 4
    assert chrome.find_elements("css selector", "table.replay tbody tr")
    assert not chrome.title.startswith("pwned")
    assert canary.hits == []


@pytest.mark.slow
def test_a_thousand_tasks_open_whole(chrome: Any, tmp_path: Path):
    """Every row of a 1,000-task batch is served and in the browser's table; how long it takes is
    measured by ``python -m bench --only view`` (the server's render) and printed here for the browser's
    load, not asserted (a loaded machine would fail a clock, not the viewer)."""
    out = tmp_path / "big"
    out.mkdir()
    results = [
        TaskResult(
            id=f"task-{i}",
            domain=f"d{i % 7}",
            mode="sandbox",
            exit_status=("submitted", "max_steps", "llm_error")[i % 3],
            answer=str(i),
            expected=str(i if i % 2 else -1),
            score=float(i % 2),
            steps=i % 40,
            tokens=100 * i,
            wall_seconds=i % 97,
            error=None if i % 3 != 2 else "HTTP 500",
        )
        for i in range(1000)
    ]
    (out / "results.jsonl").write_text("".join(r.model_dump_json() + "\n" for r in results))
    with viewing(out) as url:
        started = time.monotonic()
        status, _, body = fetch(url, "/" + url.split("/", 3)[3])
        served = time.monotonic() - started
        assert status == 200 and body.count(b"<tr data-outcome") == 1000
        chrome.get(url)
        loaded = chrome.execute_script(
            "const t = performance.getEntriesByType('navigation')[0]; return t.domContentLoadedEventEnd - t.startTime"
        )
        assert len(chrome.find_elements("css selector", "table#batch tbody tr")) == 1000
        _shot(chrome, tmp_path, "batch-1000")
    print(f"1,000 tasks: served in {served * 1000:.0f} ms, DOMContentLoaded after {loaded:.0f} ms")


@pytest.mark.slow
def test_the_papers_trajectories_open(tmp_path: Path):
    """The reference package's published trajectories, each named as a PATH: every step on its page."""
    need("shared-data")
    files = sorted((SHARED_DATA / "reference-trajectories").glob("trajectory_*.json"))
    assert len(files) == 8
    with viewing(*files) as url:
        token = token_of(url)
        for n, path in enumerate(files):
            status, _, body = fetch(url, f"/source?s={n}&token={token}")
            steps = len(json.loads(path.read_text())["steps"])
            assert status == 200, body[:300]
            assert body.count(b'<li class="step"') == len(load_trajectory(path).steps) == steps > 0
            assert b"<h3>Files</h3>" not in body  # a lone record: its directory is not a run's


@pytest.mark.slow
def test_bad_paths_and_flags_are_one_line_errors(tmp_path: Path):
    (tmp_path / "notes.txt").write_text("hi")
    (tmp_path / "bad.json").write_text("{not json")
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    cases = [
        (["view", str(tmp_path / "missing")], "does not exist"),
        (["view", str(tmp_path / "notes.txt")], "PATH: "),
        (["view", str(tmp_path / "bad.json")], "not JSON"),
        (["view", "--port", str(taken.getsockname()[1]), str(tmp_path)], "--port"),
        (["view", "--export", str(tmp_path / "notes.txt" / "x.html"), str(tmp_path)], "--export"),
    ]
    try:
        for args, expected in cases:
            done = subprocess.run([*JAILBOX, *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
            assert done.returncode == 2, (args, done.stdout, done.stderr)
            lines = done.stderr.strip().splitlines()
            assert expected in done.stderr and (len(lines) == 1 or "Usage:" in done.stderr), done.stderr
    finally:
        taken.close()
