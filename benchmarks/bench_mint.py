"""What minting scoped bucket credentials adds to a deploy, and what a renewal costs the host.

Run from the repository root::

    .venv/bin/python benchmarks/bench_mint.py --mints 20

Against moto's S3 and STS in server mode on loopback (tests/moto_server.py, a thread of
this process): ``--mints`` calls of :func:`ups.bucket.scoped.keys_for` (GetFederationToken
with the run's session policy), as deploy makes one before renting and one per upload to
an instance; the median and the slowest. AWS's STS answers over the internet, so add the
round trip to it there (not measured: no network here).

Then the host's side: an uploader (:class:`ups.bucket.uploader.Uploader`) reading its
credentials from the renewable file, fed ``--checkpoints`` checkpoints with the file
replaced (new keys) after each, as the supervisor does; the uploads that failed across the
renewals (goal 0).

Results go to stdout and ``--out`` (default ``benchmarks/results/mint_cpu.json``).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/ from the repo

from tests.moto_server import MotoServer
from ups import jsonio
from ups.bucket import Bucket
from ups.bucket.credentials import RENEWABLE_ENV, Keys
from ups.bucket.scoped import Access, keys_for
from ups.bucket.uploader import Uploader
from ups.log import get_logger


def _mints(server: MotoServer, n: int) -> list[float]:
    access = Access("scoped", server.url("ups"), "bench", server.endpoint_url, hours=1)
    keys_for(access)  # boto3's first client: imports and endpoint data, paid once per process
    took = []
    for _ in range(n):
        started = time.perf_counter()
        keys_for(access)
        took.append(time.perf_counter() - started)
    return took


def _renewals(server: MotoServer, root: Path, checkpoints: int) -> dict[str, int]:
    creds = root / "aws_credentials"

    def renew(name: str) -> None:
        part = creds.with_name("part")
        part.write_text(Keys(f"ASIA{name}", "s", "t", time.time() + 3600).file_text())
        part.replace(creds)

    renew("0")
    os.environ[RENEWABLE_ENV] = str(creds)
    bucket = Bucket.open(server.url("ups"), endpoint_url=server.endpoint_url)
    run_dir = root / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    uploader = Uploader(bucket, "bench", run_dir, keep_last=checkpoints).start(announce=False)
    for step in range(1, checkpoints + 1):
        path = run_dir / "checkpoints" / f"step_{step:06d}.pt"
        path.write_bytes(os.urandom(1 << 20))
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        path.with_name(path.name + ".sha256").write_text(digest + "\n")
        uploader.notify()
        renew(str(step))
        time.sleep(0.05)
    report = uploader.flush(120)
    uploader.stop()
    committed = [k for k in bucket.list("bench/checkpoints/") if k.endswith(".sha256")]
    return {
        "checkpoints": checkpoints,
        "renewals": checkpoints,
        "in_bucket": len(committed),
        "lost": checkpoints - len(committed),
        "pending": len(report.pending),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mints", type=int, default=20)
    parser.add_argument("--checkpoints", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/mint_cpu.json"))
    args = parser.parse_args()
    get_logger("bench")  # structlog configured before the uploader logs
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        server = MotoServer(root / "moto")
        for key, value in server.client_env().items():
            os.environ[key] = value
        server.start()
        try:
            took = _mints(server, args.mints)
            renewals = _renewals(server, root, args.checkpoints)
        finally:
            server.stop()
    result = {
        "mint_s": {
            "median": round(statistics.median(took), 4),
            "max": round(max(took), 4),
            "n": len(took),
        },
        "deploy_adds_s": round(2 * statistics.median(took), 4),
        "renewals": renewals,
    }
    text = jsonio.dumps(result, indent=2)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
