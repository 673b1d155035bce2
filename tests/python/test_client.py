"""The `tessera` Python package against real daemons: values and gradients through the C++ client library."""

import numpy as np
import pytest

import tessera
from conftest import run_workers

N = 10  # elements of the test parameter: 3 chunks of at most 4 floats on 2 servers


def test_sync_workers_apply_the_batch_weighted_mean_once_per_round(start_cluster):
    lr = 0.5
    cluster = start_cluster(mode="SYNC", servers=2, workers=2, lr=lr)
    batch = {0: 1, 1: 3}
    grads = {r: (r + 1) * np.arange(N, dtype=np.float32) for r in range(2)}
    mean = (batch[0] * grads[0] + batch[1] * grads[1]) / 4
    seen = {}

    def worker(rank):
        client = tessera.Client.connect(cluster.address, rank=rank, connect_timeout_s=30)
        assert client.worker_id == rank
        client.declare([("w", [N], 0.0, 0)])
        w = np.empty(N, np.float32)
        client.pull(["w"], [w])
        assert np.all(w == 0)
        # Step 0: push, the clock gate, pull.
        client.push(["w"], [grads[rank]], batch[rank])
        gate = client.advance_clock()
        assert gate["clock"] == 1 and not gate["stop"]
        client.pull(["w"], [w])
        seen[(rank, 1)] = w.copy()
        # Step 1: one exchange per chunk (begin_step), the values written into `w` in place.
        step = client.begin_step(["w"], [grads[rank]], batch[rank], [w])
        step.send(0)
        gate = step.finish()
        step.wait_values(0)
        assert gate["clock"] == 2
        seen[(rank, 2)] = w.copy()
        client.done()

    run_workers(2, worker)
    for rank in range(2):
        np.testing.assert_allclose(seen[(rank, 1)], -lr * mean, rtol=1e-6)
        np.testing.assert_allclose(seen[(rank, 2)], -2 * lr * mean, rtol=1e-6)


def test_async_pushes_are_applied_on_arrival_and_push_pull_answers_the_values(start_cluster):
    lr = 0.25
    cluster = start_cluster(mode="ASYNC", servers=1, workers=1, lr=lr)
    client = tessera.connect(scheduler=cluster.address, rank=0)
    assert client.rank == 0 and client.mode == "ASYNC"
    c = client.client
    c.declare([("w", [N], 0.0, 0)])
    g = np.linspace(-1, 1, N, dtype=np.float32)
    c.push(["w"], [g], 4)
    out = np.empty(N, np.float32)
    c.push_pull(["w"], [g], 4, [out])
    np.testing.assert_allclose(out, -2 * lr * g, rtol=1e-6)
    c.done()


def test_bad_input_raises_with_the_message_and_changes_nothing(start_cluster):
    cluster = start_cluster(mode="ASYNC", servers=1, workers=1)
    c = tessera.Client.connect(cluster.address, rank=0)
    c.declare([("w", [N], 0.0, 0)])
    with pytest.raises(tessera.Error, match="INVALID_ARGUMENT: .*shape"):
        c.push(["w"], [np.ones(N + 1, np.float32)], 1)
    with pytest.raises(tessera.Error, match="NOT_FOUND"):
        c.pull(["nope"], [np.empty(N, np.float32)])
    with pytest.raises(tessera.Error, match="float32"):
        c.push(["w"], [np.ones(N, np.float64)], 1)
    with pytest.raises(tessera.Error, match="contiguous"):
        c.push(["w"], [np.ones(2 * N, np.float32)[::2]], 1)
    with pytest.raises(tessera.Error, match="INVALID_ARGUMENT: .*finite"):
        bad = np.zeros(N, np.float32)
        bad[3] = np.nan
        c.push(["w"], [bad], 1)
    w = np.empty(N, np.float32)
    c.pull(["w"], [w])
    assert np.all(w == 0), "no refused push changed the values"
    c.done()


def test_a_wrong_token_is_refused_naming_it(start_cluster, tmp_path):
    token = tmp_path / "token"
    token.write_text("the-right-token-0123456789\n")
    wrong = tmp_path / "wrong"
    wrong.write_text("another-token-0123456789\n")
    cluster = start_cluster(mode="SYNC", servers=1, workers=1, token_file=token)
    with pytest.raises(tessera.Error, match="UNAUTHENTICATED"):
        tessera.Client.connect(cluster.address, rank=0, token_file=str(wrong), connect_timeout_s=5)
    job = tessera.connect(scheduler=cluster.address, token_file=str(token))
    assert job.rank == 0
    job.client.done()


def test_connect_takes_its_settings_from_the_environment(start_cluster, monkeypatch):
    cluster = start_cluster(mode="SSP", servers=1, workers=2)
    monkeypatch.setenv("TESSERA_SCHEDULER", cluster.address)
    monkeypatch.setenv("TESSERA_RANK", "1")
    job = tessera.connect()
    assert job.rank == 1
    assert job.spec["cluster"]["num_workers"] == 2
    job.client.done()
    monkeypatch.setenv("TESSERA_RANK", "one")
    with pytest.raises(tessera.Error, match="TESSERA_RANK"):
        tessera.connect()


def test_no_scheduler_is_unavailable_naming_the_address():
    with pytest.raises(tessera.Error, match="UNAVAILABLE: .*127.0.0.1:1"):
        tessera.Client.connect("127.0.0.1:1", connect_timeout_s=1)
