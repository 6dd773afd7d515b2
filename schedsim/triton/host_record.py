"""The Triton profile's host-variation record: how fast lone requests go through a server.

Lone single-sample requests on the zero-delay model, one at a time over one kept-alive HTTP
connection, each timed by the client (the frontend, the batcher and the model: what every
request of a live run passes through). :func:`one_server` records the table's own server in
5 rounds; :func:`fresh_servers` times one round on each of several servers started one after
another, since each fresh server settles at its own speed, and a band replays how much
slower or faster than the table's server a fresh one ran.
"""

from __future__ import annotations

from pathlib import Path

from schedsim.errors import InputError

MODEL = "profile_d0"
"""The zero-delay model (max_queue_delay 0, one instance) the profile writes beside the table's: lone requests go to it."""
CALL = "one request of seq_len {seq_len} through the server (HTTP, client time)"


def one_server(server, spec, rng) -> tuple[dict, tuple | None]:
    """(record, round): the record of ``server`` over 5 rounds of ``spec.host_variation_s``;
    with fresh servers to come (``spec.host_servers``), one more round timed here, the table's
    own server's among theirs (:func:`fresh_servers`); else None."""
    from schedsim.profiling.host_variation import measure, time_round

    call, close = lone_request(server, spec.seq_len, rng)
    try:
        record = measure(call, rounds=5, round_s=spec.host_variation_s, window_s=window_s(spec),
                         pause_s=min(0.5, spec.host_variation_s / 4), what=CALL.format(seq_len=spec.seq_len))
        return record, time_round(call, spec.host_variation_s) if spec.host_servers else None
    finally:
        close()


def window_s(spec) -> float:
    return min(0.25, spec.host_variation_s / 4)


def lone_request(server, seq_len: int, rng):
    """(call, close): one lone request to the zero-delay model over a kept-alive HTTP connection."""
    import http.client

    from schedsim.triton.client import _body_parts

    prefix, suffix = _body_parts(seq_len, 30522, rng)
    body = prefix + b"host-variation" + suffix
    host, port = server.url.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)

    def call() -> None:
        conn.request("POST", f"/v2/models/{MODEL}/infer", body, {"Content-Type": "application/json"})
        answer = conn.getresponse()
        answer.read()
        if answer.status != 200:
            raise InputError(f"host variation: Triton answered {MODEL} with HTTP {answer.status}")

    return call, conn.close


FRESH_WARMUP_REQUESTS = 50
"""Lone requests each fresh server answers before its round is timed."""


def fresh_servers(spec, repo: Path, one: dict, first: tuple, raw: Path, env: dict, rng, note) -> dict:
    """The record over fresh servers of ``repo`` (the zero-delay model alone): the table's own
    server's round (``first``) first, then one round on each of ``spec.host_servers`` servers
    started one after another (each warmed by :data:`FRESH_WARMUP_REQUESTS`). Its factors are
    over the table's own server's round; the record of the table's server alone (``one``) is
    kept under ``one_server``."""
    from schedsim.profiling.host_variation import relative_to, summarise, time_round
    from schedsim.triton.server import TritonServer, find_tritonserver

    samples = [first]
    for k in range(spec.host_servers):
        with TritonServer(repo, raw / f"host_server_{k + 1}.log", find_tritonserver(), env=env,
                          ready_timeout_s=spec.ready_timeout_s) as server:
            call, close = lone_request(server, spec.seq_len, rng)
            try:
                for _ in range(FRESH_WARMUP_REQUESTS):
                    call()
                samples.append(time_round(call, spec.host_variation_s))
            finally:
                close()
        note(f"host variation: server {k + 1} of {spec.host_servers}: mean {samples[-1][1].mean() * 1e3:.3f} ms "
             f"(the table's server: {first[1].mean() * 1e3:.3f} ms)")
    record = summarise(samples, window_s(spec), round_s=spec.host_variation_s, what=CALL.format(seq_len=spec.seq_len))
    record = relative_to(record, float(first[1].mean()) * 1e3, "the table's own server, its round")
    return record | {"rounds_are": "servers",
                     "scope": f"{len(samples)} Triton servers started one after another on one machine, one round "
                              "each, the first the table's own", "one_server": one,
                     "method": f"lone requests timed back to back for {spec.host_variation_s:g} s on each server (after "
                               f"{FRESH_WARMUP_REQUESTS} warm-up requests on a fresh one); "
                               "between_runs_cv = std/mean of the servers' medians; within_run_cv = std of the "
                               f"{window_s(spec):g}-second window medians over their server's median; the "
                               "timeline from means, over the table's server's round"}
