"""Hub ids (`org/name`, `org/name@revision`) through huggingface_hub, tested without a network.

A loopback server plays the hub for two commits of one tiny model (written by transformers). huggingface_hub
itself downloads from it and lays out its cache; then, with the server gone and HF_HUB_OFFLINE=1, the same
ids load from that cache, the pinned revision included, and a model that is not cached is a clear error.
"""

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from test_architectures import write_tiny

pytestmark = pytest.mark.slow

REPO = "dcsjax-test/tiny-qwen3"


class FakeHub(ThreadingHTTPServer):
    """commits: {sha: {filename: bytes}}; refs: {"main": sha}. Serves what snapshot_download asks for."""

    def __init__(self, commits: dict, refs: dict):
        super().__init__(("127.0.0.1", 0), Handler)
        self.commits, self.refs, self.requests = commits, refs, []

    def resolve(self, revision: str) -> str | None:
        return self.refs.get(revision, revision if revision in self.commits else None)


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def send(self, code: int, body: bytes = b"", headers: dict | None = None, head: bool = False):
        self.send_response(code)
        for k, v in {"Content-Length": str(len(body)), **(headers or {})}.items():
            self.send_header(k, v)
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def route(self, head: bool):
        hub, path = self.server, self.path.split("?")[0]
        hub.requests.append(f"{self.command} {path}")
        prefix = f"/api/models/{REPO}/"
        if path.startswith(prefix + "revision/"):
            sha = hub.resolve(path[len(prefix + "revision/"):])
            if sha is None:
                return self.send(404, b'{"error": "Revision Not Found"}', {"X-Error-Code": "RevisionNotFound"})
            body = {"id": REPO, "sha": sha, "siblings": [{"rfilename": f} for f in sorted(hub.commits[sha])]}
            return self.send(200, json.dumps(body).encode(), {"Content-Type": "application/json"}, head)
        if path.startswith(prefix + "tree/"):
            sha = hub.resolve(path[len(prefix + "tree/"):].split("/")[0])
            files = [{"type": "file", "path": f, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
                     for f, b in sorted(hub.commits.get(sha, {}).items())]
            return self.send(200, json.dumps(files).encode(), {"Content-Type": "application/json"}, head)
        if path.startswith(f"/{REPO}/resolve/"):
            revision, _, filename = path[len(f"/{REPO}/resolve/"):].partition("/")
            sha = hub.resolve(revision)
            data = hub.commits.get(sha, {}).get(filename)
            if data is None:
                return self.send(404, b"", {"X-Error-Code": "EntryNotFound"}, head)
            return self.send(200, data, {"X-Repo-Commit": sha, "ETag": f'"{hashlib.sha256(data).hexdigest()}"'}, head)
        return self.send(404, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"}, head)

    def do_GET(self):
        self.route(head=False)

    def do_HEAD(self):
        self.route(head=True)


SCRIPT = textwrap.dedent("""
    import json, sys
    import dcsjax
    from dcsjax.errors import DcsjaxError
    out = {}
    for hub_id in sys.argv[1:]:
        try:
            scorer = dcsjax.load(hub_id, document_start="<|endoftext|>")
            out[hub_id] = {"name": scorer.name, "score": float(scorer.score(["The hub serves this text."])[0]),
                           "fingerprint": scorer.model_fingerprint}
        except DcsjaxError as err:
            out[hub_id] = {"error": str(err)}
    print(json.dumps(out))
    """)


def load_in_process(hf_home: Path, ids: list[str], endpoint: str | None) -> dict:
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "0" if endpoint else "1",
           "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
    env.pop("HF_HUB_CACHE", None)
    if endpoint:
        env["HF_ENDPOINT"] = endpoint
    proc = subprocess.run([sys.executable, "-c", SCRIPT, *ids], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def commits(tmp_path_factory):
    root = tmp_path_factory.mktemp("commits")
    out = {}
    for seed_family, sha in [("qwen3", "a" * 40), ("qwen2", "b" * 40)]:  # two commits: the model changed
        folder = root / sha
        write_tiny(seed_family, folder)
        out[sha] = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    return root, out


def test_hub_ids_load_online_then_offline_from_the_cache(tmp_path, commits):
    import dcsjax

    root, files = commits
    old, new = "a" * 40, "b" * 40
    hub = FakeHub(files, {"main": new})
    thread = threading.Thread(target=hub.serve_forever, daemon=True)
    thread.start()
    try:
        online = load_in_process(tmp_path / "hf", [REPO, f"{REPO}@{old}"], f"http://127.0.0.1:{hub.server_port}")
    finally:
        hub.shutdown()
    assert any(r.startswith("GET /" + REPO + "/resolve/") for r in hub.requests)
    for hub_id, sha in [(REPO, new), (f"{REPO}@{old}", old)]:
        got = online[hub_id]
        assert "error" not in got, got
        assert got["name"] == "dcsjax-test--tiny-qwen3"
        assert got["fingerprint"]["hub"] == REPO and got["fingerprint"]["revision"] == sha
        local = dcsjax.load(root / sha, document_start="<|endoftext|>")  # the same files, read directly
        assert got["score"] == float(local.score(["The hub serves this text."])[0])
    assert online[REPO]["score"] != online[f"{REPO}@{old}"]["score"]
    snapshots = tmp_path / "hf" / "hub" / "models--dcsjax-test--tiny-qwen3" / "snapshots"
    assert sorted(p.name for p in snapshots.iterdir()) == [old, new]  # huggingface_hub's own layout

    offline = load_in_process(tmp_path / "hf", [REPO, f"{REPO}@{old}", "dcsjax-test/absent"], None)
    assert offline[REPO]["score"] == online[REPO]["score"]
    assert offline[f"{REPO}@{old}"]["score"] == online[f"{REPO}@{old}"]["score"]
    message = offline["dcsjax-test/absent"]["error"]
    assert "dcsjax-test/absent: not in the Hugging Face cache" in message and "HF_HUB_OFFLINE is set" in message
    assert "hf download dcsjax-test/absent" in message
