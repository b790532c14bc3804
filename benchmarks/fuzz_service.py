"""Fuzzes the parameter service with authenticated requests whose JSON is mutated.

A client that holds the fit's token (a buggy or hostile worker) sends pushes, joins
and failure reports built from valid ones, with their JSON changed the way a fuzzer
would: values replaced by other types (strings, lists, nested objects, null, bools),
by huge or odd numbers (10**400, 2**63, -1, NaN, Infinity, 1e308), by wrong codecs
(``float8``, ``object``, ``<f4``, ``complex64``...), keys dropped, added or
duplicated, structures nested dozens deep (or 50,000 deep in the raw text), the
header replaced by a list or cut short. The service runs in this process on 127.0.0.1
(cheroot, as a fit runs it) with two workers joined; the script reads the store's state
before and after each request.

With ``--codecs`` the service runs with compressed updates (``compression=``): each
worker first pulls the full weights, then pushes the codec's arrays naming its copy of
the center, and besides the JSON mutations the codec's arrays themselves are broken:
top-k indices out of range or repeated, more values than ``k``, NaN, infinite and huge
values, sign bits cut short, negative or NaN scales, wrong dtypes and lengths, copy
numbers the service never sent, and pushes flagged ``whole`` (a worker's closing push,
sent unencoded) with encoded arrays or a flag that is not a bool.

Printed per mode: requests sent, answers 2xx (a mutation that left a valid request:
taken), 4xx, and >= 500, state changes after a refused request (there must be none: a
refused request changes nothing), and whether ``GET /status`` stayed strict JSON.

Run:
    .venv/bin/python benchmarks/fuzz_service.py                 # 10,000 per mode
    .venv/bin/python benchmarks/fuzz_service.py --requests 500 --seed 1
    .venv/bin/python benchmarks/fuzz_service.py --codecs fp16 bf16 topk sign
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import struct
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import urllib3

from sparkdl.protocol import wire
from sparkdl.server.state.replicas import FULL
from sparkdl.server.state.store import WeightStore
from sparkdl.server.web.service import ParameterService
from sparkdl.sync.codecs import Codec, resolve_compression
from sparkdl.sync.merges import Average, Delta, Elastic, float_limit

MODES = {
    "synchronous": Average(),
    "asynchronous": Delta(),
    "hogwild": Elastic(alpha=0.45),
}
SHAPES = [(16, 8), (8,), (3,)]
DTYPES = [np.float32, np.float32, np.int64]
#: With a codec: one array large enough to be compressed (over DENSE_BELOW values).
CODEC_SHAPES = [(40, 8), (8,), (3,)]
ROWS = 1000

#: Values a mutation puts in place of another.
ODD_VALUES: list[Any] = [
    10**400,
    -(10**400),
    2**63,
    2**62 - 1,
    -1,
    0,
    1.5,
    -0.0,
    float("nan"),
    float("inf"),
    float("-inf"),
    1e308,
    "",
    "0",
    "float32",
    "x" * 5000,
    None,
    True,
    False,
    [],
    [1, 2],
    [[[[1]]]],
    {},
    {"a": {"b": [1, {"c": None}]}},
]
ODD_DTYPES = ["float8", "object", "<f4", ">f4", "complex64", "float128", "str", "V8", "bfloat16"]
ODD_SHAPES: list[Any] = [[-1], [2**40], [16, "8"], [[16], [8]], [16.0, 8.0], [1] * 40, None, 16]


@dataclass
class Figures:
    """What one mode's run counted."""

    requests: int = 0
    taken: int = 0
    refused: int = 0
    server_errors: int = 0
    changed_on_refusal: int = 0
    status_strict_json: bool = True
    examples: list[str] = field(default_factory=list)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000, help="requests per mode")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--modes", nargs="*", default=list(MODES), choices=list(MODES))
    parser.add_argument(
        "--codecs", nargs="*", default=[None], help="fp16, bf16, topk, sign (default: none)"
    )
    args = parser.parse_args()
    print(
        "| mode | codec | requests | taken (2xx) | refused (4xx) | answers >= 500 | "
        "state changes on refusal | /status strict JSON | seconds |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---|---:|")
    failed = False
    for mode, codec in ((m, c) for c in args.codecs for m in args.modes):
        started = time.perf_counter()
        figures = fuzz(mode, args.requests, seed=args.seed, codec=codec)
        seconds = time.perf_counter() - started
        print(
            f"| {mode} | {codec or '-'} | {figures.requests} | {figures.taken} | "
            f"{figures.refused} | {figures.server_errors} | {figures.changed_on_refusal} | "
            f"{'yes' if figures.status_strict_json else 'NO'} | {seconds:.1f} |",
            flush=True,
        )
        failed |= bool(figures.server_errors or figures.changed_on_refusal)
        failed |= not figures.status_strict_json
        for example in figures.examples[:5]:
            print(f"    {example}")
    raise SystemExit(1 if failed else 0)


def fuzz(mode: str, requests: int, *, seed: int = 0, codec: str | None = None) -> Figures:
    """Sends ``requests`` mutated, authenticated requests to a service of ``mode``
    (a fresh one after a taken fatal failure report ended the fit), its updates
    compressed with ``codec`` when one is named."""
    rng = random.Random(seed)
    figures = Figures()
    while figures.requests < requests:
        _serve_and_fuzz(mode, requests, rng, figures, codec)
    return figures


def _serve_and_fuzz(
    mode: str, requests: int, rng: random.Random, figures: Figures, codec: str | None = None
) -> None:
    shapes = CODEC_SHAPES if codec else SHAPES
    weights = [np.zeros(s, d) for s, d in zip(shapes, DTYPES, strict=True)]
    merge = MODES[mode]
    if codec and isinstance(merge, Average):
        merge = Average(relative=True)  # as a fit resolves it under compression
    store = WeightStore(
        weights,
        num_workers=2,
        merge=merge,
        mode=mode,
        compression=resolve_compression(codec, 0.05, 2),
    )
    store.plan_rows([ROWS, ROWS])  # as a fit plans them before its workers join
    for worker in range(2):
        store.join(worker, ROWS, wait=0.0)
    # As in a fit, an attempt is taken only when Spark confirms it: here attempt 0.
    with ParameterService(store, host="127.0.0.1", attempts=_live_attempt) as service:
        auth = {"Authorization": f"Bearer {service.token}"}
        pool = urllib3.HTTPConnectionPool(
            "127.0.0.1", service.port, retries=False, timeout=urllib3.Timeout(10.0), maxsize=1
        )
        if codec:  # each worker's copy of the center starts from the full weights
            for worker in range(2):
                pool.urlopen(
                    "GET", f"/weights?worker={worker}&attempt=0&replica={FULL}", headers=auth
                )
        try:
            while figures.requests < requests and store.status()["aborted"] is None:
                if store.replicas is not None:
                    path, content_type, body = _codec_request(rng, store)
                else:
                    path, content_type, body = _request(rng, store)
                before = training_state(store)
                response = pool.urlopen(
                    "POST",
                    path + "?wait=0",
                    body=body,
                    headers={**auth, "Content-Type": content_type},
                )
                figures.requests += 1
                if response.status >= 500:
                    figures.server_errors += 1
                    figures.examples.append(f"{response.status} for {body[:120]!r}")
                elif response.status >= 400:
                    figures.refused += 1
                    if training_state(store) != before:
                        figures.changed_on_refusal += 1
                        figures.examples.append(f"state changed by refused {body[:120]!r}")
                else:
                    figures.taken += 1
            status = pool.urlopen("GET", "/status", headers=auth)
            try:
                json.loads(status.data, parse_constant=_refuse_constant)
            except ValueError:
                figures.status_strict_json = False
            if status.status != 200:
                figures.status_strict_json = False
                figures.examples.append(f"/status answered {status.status}: {status.data[:200]!r}")
        finally:
            pool.close()


def _request(rng: random.Random, store: WeightStore) -> tuple[str, str, bytes]:
    """One mutated request: a push (mostly), a join or a failure report."""
    kind = rng.random()
    if kind < 0.8:
        header = _valid_push_header(rng, store)
        for _ in range(rng.randint(1, 3)):
            header = _mutate(rng, header)
        return "/push", wire.CONTENT_TYPE, _frame(rng, header)
    worker = rng.randrange(2)
    if kind < 0.9:
        report: Any = {"worker": worker, "rows": ROWS, "attempt": 0}
        path = "/join"
    else:
        report = {"worker": worker, "traceback": "x", "attempt": 0, "fatal": False}
        path = "/fail"
    for _ in range(rng.randint(1, 3)):
        report = _mutate(rng, report)
    return path, "application/json", _json_text(rng, report).encode("utf-8", "surrogatepass")


def _valid_push_header(rng: random.Random, store: WeightStore) -> dict[str, Any]:
    status = store.status()
    worker = rng.randrange(2)
    record = status["workers"].get(str(worker), {})
    specs = [
        {"dtype": np.dtype(d).name, "shape": list(s)} for s, d in zip(SHAPES, DTYPES, strict=True)
    ]
    meta = {
        "worker": worker,
        "seq": int(record.get("seq", 0)) + 1,
        "attempt": 0,
        "base_version": status["version"],
        "samples": rng.randint(0, ROWS),
        "loss": rng.random(),
        "epoch": 0,
        "step": rng.randint(0, 30),
        "comm_seconds": rng.random(),
    }
    if rng.random() < 0.3:
        meta.update(epoch_logs={"loss": rng.random(), "acc": rng.random()}, epoch_samples=10)
    return {"arrays": specs, "meta": meta}


def _codec_request(rng: random.Random, store: WeightStore) -> tuple[str, str, bytes]:
    """A push of the codec's arrays, its header or its arrays (or both) broken; now and
    then a join or failure report as in :func:`_request`."""
    assert store.replicas is not None
    if rng.random() < 0.1:
        return _request(rng, store)
    header = _valid_push_header(rng, store)
    worker = header["meta"]["worker"]
    _, base, pending = store.replicas.copy_state()[str(worker)]
    header["meta"]["replica"] = rng.choice([base, *pending]) if base != FULL else pending[-1]
    scale = rng.choice([1e-3, 1.0, 1e3])
    update = [
        np.random.default_rng(rng.randrange(2**32)).normal(size=s).astype(d) * scale
        if np.dtype(d).kind == "f"
        else np.zeros(s, d)
        for s, d in zip(CODEC_SHAPES, DTYPES, strict=True)
    ]
    parts = store.replicas.codec.encode(update)
    if rng.random() < 0.2:  # a closing push sent whole (now and then flagged wrong)
        header["meta"]["whole"] = rng.choice([True, True, True, False, 1, "true", None])
        parts = update if rng.random() < 0.8 else parts
    broken = rng.random()
    if broken < 0.45:
        parts = _break_parts(rng, store.replicas.codec, parts)
    header["arrays"] = [{"dtype": p.dtype.name, "shape": list(p.shape)} for p in parts]
    if broken > 0.3:
        for _ in range(rng.randint(1, 2)):
            header = _mutate(rng, header)
    return "/push", wire.CONTENT_TYPE, _frame(rng, header, parts)


def _break_parts(rng: random.Random, codec: Codec, parts: list[np.ndarray]) -> list[np.ndarray]:
    """``parts`` with one of them broken the way a buggy or hostile encoder would."""
    with np.errstate(over="ignore", invalid="ignore"):  # casts to float16 may overflow
        return _break_one(rng, [np.array(p, copy=True) for p in parts])


def _break_one(rng: random.Random, parts: list[np.ndarray]) -> list[np.ndarray]:
    i = rng.randrange(len(parts))
    part = parts[i]
    op = rng.randrange(9)
    if op == 0 and part.size:  # an index out of range, or a huge count
        part.reshape(-1)[rng.randrange(part.size)] = (
            np.iinfo(part.dtype).max if part.dtype.kind in "ui" else 3e38
        )
    elif op == 1 and part.size > 1:  # a value repeated (top-k: an index twice)
        flat = part.reshape(-1)
        flat[1] = flat[0]
    elif op == 2:  # one value more
        parts[i] = np.concatenate([part.reshape(-1), part.reshape(-1)[:1]])
    elif op == 3 and part.size:  # one value fewer
        parts[i] = part.reshape(-1)[:-1]
    elif op == 4 and part.dtype.kind == "f" and part.size:
        part.reshape(-1)[0] = rng.choice([np.nan, np.inf, -np.inf, -1.0, 1e38])
    elif op == 5:  # another dtype
        parts[i] = part.astype(rng.choice([np.float64, np.int64, np.uint8, np.float16, np.int32]))
    elif op == 6:  # a part dropped or added
        if rng.random() < 0.5:
            del parts[i]
        else:
            parts.insert(i, part)
    elif op == 7:  # reshaped
        parts[i] = part.reshape(-1, 1) if part.ndim == 1 else part.reshape(-1)
    else:  # every value huge: the center would overflow
        if part.dtype.kind == "f":
            part[...] = float_limit(part.dtype)
    return parts


def _mutate(rng: random.Random, value: Any) -> Any:
    """``value`` with one random change somewhere in its JSON structure."""
    value = copy.deepcopy(value)
    paths = list(_paths(value))
    path = rng.choice(paths)
    parent, key = _locate(value, path)
    op = rng.random()
    if parent is None:  # the whole document
        return rng.choice([[value], "header", 7, None, _nested(rng.randint(2, 60))])
    current = parent[key]
    if op < 0.5:
        if isinstance(key, str) and key == "dtype":
            parent[key] = rng.choice(ODD_DTYPES + ODD_VALUES)
        elif isinstance(key, str) and key == "shape":
            parent[key] = rng.choice(ODD_SHAPES)
        else:
            parent[key] = rng.choice(ODD_VALUES)
    elif op < 0.65 and isinstance(parent, dict):
        del parent[key]
    elif op < 0.8 and isinstance(parent, dict):
        parent[rng.choice(["extra", "seq ", "Worker", "__proto__", "x" * 300])] = rng.choice(
            ODD_VALUES
        )
    elif op < 0.9:
        parent[key] = _nested(rng.randint(2, 60), leaf=current)
    elif isinstance(parent, list) and parent:
        parent.append(copy.deepcopy(rng.choice(parent)))  # one array spec too many
    else:
        parent[key] = [current, current]
    return value


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Any:
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*prefix, i))


def _locate(value: Any, path: tuple[Any, ...]) -> tuple[Any, Any]:
    if not path:
        return None, None
    parent = value
    for step in path[:-1]:
        parent = parent[step]
    return parent, path[-1]


def _nested(depth: int, leaf: Any = 1) -> Any:
    for _ in range(depth):
        leaf = [leaf]
    return leaf


def _json_text(rng: random.Random, value: Any) -> str:
    text = json.dumps(value)  # NaN and Infinity as Python writes them
    cut = rng.random()
    if cut < 0.02:
        return "[" * 50_000 + text  # nested deeper than any parser's stack
    if cut < 0.05:
        return text[: rng.randrange(len(text) + 1)]  # cut short
    if cut < 0.08:
        return text + "\udcff"  # not UTF-8
    return text


def _frame(rng: random.Random, header: Any, parts: list[np.ndarray] | None = None) -> bytes:
    """A wire message with ``header`` as its JSON (whatever its structure) and the
    buffers of ``parts`` (default: those a valid push of :data:`SHAPES` would carry)."""
    text = _json_text(rng, header).encode("utf-8", "surrogatepass")
    head = struct.pack("<4sB3xI", b"SDLW", 1, len(text)) + text
    head += b"\0" * (-len(head) % 8)
    if parts is None:
        parts = [np.ones(s, d) for s, d in zip(SHAPES, DTYPES, strict=True)]
    buffers = b"".join(p.tobytes() + b"\0" * (-p.nbytes % 8) for p in parts)
    return head + buffers


def training_state(store: WeightStore) -> str:
    """The training state a refused request must leave as it was, as one string: the
    version, samples, history, abort reason, open round and rows joined with, each
    worker's sequence number, attempt, samples, pushes, position and last loss, the
    weights, and with compression each worker's copy numbers of the center."""
    status = store.status()
    workers = {
        w: {k: r[k] for k in ("seq", "attempt", "samples", "pushes", "position", "last_loss")}
        for w, r in status["workers"].items()
    }
    kept = {
        k: status[k]
        for k in ("version", "samples_seen", "history", "aborted", "round_pushed", "joined_rows")
    }
    weights = [w.tobytes().hex() for w in store.weights()]
    copies = store.replicas.copy_state() if store.replicas is not None else None
    return json.dumps([kept, workers, weights, copies], sort_keys=True)


def _live_attempt(worker: int, attempt: int) -> bool:
    return attempt == 0


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


if __name__ == "__main__":
    main()
