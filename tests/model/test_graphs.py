"""CUDA-graph replay of a model's inference forward: the bookkeeping on CPU (length buckets,
re-capture on new shapes, never a stale graph) with the ``Eager`` backend, and real graphs on CUDA."""

import pytest
import torch

from nystrom.model import NystromformerConfig, NystromformerModel
from nystrom.utils.graphs import CudaGraphs, Eager, GraphedForward, bucket

from oracle import rel_err


def _model(device: str = "cpu", dtype=torch.float64, *, positions: int = 64) -> NystromformerModel:
    cfg = NystromformerConfig(
        vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=positions, dropout=0.0,
        attention={"name": "nystrom", "num_landmarks": 4, "conv_kernel_size": 3},
    )  # fmt: skip
    return NystromformerModel(cfg).to(device=device, dtype=dtype).eval()


class Recording(Eager):
    """Eager capture that records which capture every replay belongs to."""

    def __init__(self) -> None:
        self.replays: list[int] = []
        self.made = 0

    def capture(self, run):
        self.made += 1
        out, replay = super().capture(run)
        me = self.made
        return out, lambda: (self.replays.append(me), replay())[1]


def _runner(model, backend, buckets=(16, 32, 64)):
    return GraphedForward(
        model,
        lambda i, m: model(input_ids=i, attention_mask=m).last_hidden_state,
        buckets=buckets,
        backend=backend,
    )


def _recorded(tokens: tuple[int, int]):
    """A model, a recording backend, its runner and random ids (b, n)."""
    model, backend = _model(), Recording()
    return model, backend, _runner(model, backend), torch.randint(1, 40, tokens)


def test_bucket_is_the_smallest_that_fits_and_refuses_longer_inputs():
    assert [bucket(n, (16, 64, 32)) for n in (1, 16, 17, 33, 64)] == [16, 16, 32, 64, 64]
    with pytest.raises(ValueError, match="fits no bucket"):
        bucket(65, (16, 64))


def test_replays_equal_the_unpadded_forward_and_reuse_one_capture_per_bucket_and_batch():
    model, backend, run, ids = _recorded((2, 50))
    with torch.inference_mode():
        for n in (20, 27, 32, 9, 50):  # buckets 32, 32, 32, 16, 64
            got = run(ids[:, :n])
            assert got.shape == (2, n, 16)
            assert rel_err(got, model(input_ids=ids[:, :n]).last_hidden_state) <= 1e-12
        assert run.captures == 3
        run(ids[:1, :20])  # another batch size: its own graph
        assert run.captures == 4
        mask = torch.ones(2, 30, dtype=torch.long)
        mask[1, 21:] = 0  # a padded sample inside a bucket
        got = run(ids[:, :30], mask)
        assert rel_err(got[1, :21], model(input_ids=ids[1:, :21]).last_hidden_state[0]) <= 1e-12
    assert backend.replays == [1, 1, 1, 2, 3, 4, 1]


def test_a_replaced_parameter_or_a_mode_switch_recaptures_and_in_place_updates_do_not():
    model, backend, run, ids = _recorded((1, 12))
    with torch.inference_mode():
        first = run(ids)
    with torch.no_grad():
        model.embeddings.word_embeddings.weight.mul_(2)  # in place: the graph reads the new values
    with torch.inference_mode():
        second = run(ids)
    assert run.captures == 1 and backend.replays == [1, 1]
    assert not torch.equal(first, second)
    model.embeddings.word_embeddings.weight = torch.nn.Parameter(
        model.embeddings.word_embeddings.weight.clone()
    )
    with torch.inference_mode():
        third = run(ids)  # a replaced parameter: the old graph would read freed memory, so it is recaptured
    assert run.captures == 2 and backend.replays == [1, 1, 2]
    assert rel_err(third, second) <= 1e-12
    model.train()
    with torch.inference_mode():
        run(ids)
    assert run.captures == 3 and backend.replays[-1] == 3  # never the stale graph 2
    assert list(run.graphs) == [(1, 16, torch.int64, "cpu")]  # stale graphs are dropped, not kept


def test_refuses_autograd_and_bad_shapes():
    run = _runner(_model(), Eager())
    with pytest.raises(RuntimeError, match="inference"):
        run(torch.ones(1, 4, dtype=torch.long))
    with torch.inference_mode(), pytest.raises(ValueError, match="attention_mask"):
        run(torch.ones(1, 4, dtype=torch.long), torch.ones(1, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="buckets"):
        GraphedForward(torch.nn.Linear(1, 1), lambda i, m: i, buckets=())


def test_cuda_graphs_run_every_kernel_once_before_the_capture(monkeypatch):
    """The warm-up runs (the fused kernels' first launches: compile, module load, local-memory
    reservation) all happen on the side stream before the capture opens, and at least one is required.
    On CPU, with torch.cuda's stream and graph calls recorded instead of made."""
    events = []

    class Context:
        def __init__(self, name):
            self.name = name

        def __enter__(self):
            events.append(f"enter {self.name}")

        def __exit__(self, *exc):
            events.append(f"exit {self.name}")

    class Stream:
        def wait_stream(self, other):
            events.append("wait")

    class Graph:
        def pool(self):
            return "pool"

        def replay(self):
            events.append("replay")

    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", Stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: Context("side stream"))
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", lambda g, pool=None: Context("capture"))
    out, replay = CudaGraphs(warmup=2).capture(lambda: events.append("run") or torch.ones(1))
    replay()
    assert events == ["wait", "enter side stream", "run", "run", "exit side stream", "wait",
                      "enter capture", "run", "exit capture", "replay"]  # fmt: skip
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="warmup"):
            CudaGraphs(warmup=bad)


@pytest.mark.parametrize(
    "device",
    [pytest.param("cpu", id="cpu-eager"), pytest.param("cuda", id="cuda-graphs", marks=pytest.mark.gpu)],
)
def test_graphs_replay_the_forward(device):
    """Real CUDA graphs on CUDA, the ``Eager`` stand-in on the CPU: the same buckets and lengths.
    Regression: the bucket of 256 tokens needs a position table of 256 (it had 64, so the CUDA run failed)."""
    model = _model(device, torch.float32, positions=256)
    run = GraphedForward(
        model,
        lambda i, m: model(input_ids=i, attention_mask=m).last_hidden_state,
        buckets=(64, 256),
        backend=Eager() if device == "cpu" else None,
    )
    ids = torch.randint(1, 40, (2, 200), device=device)
    with torch.inference_mode():
        for n in (200, 150, 40):
            want = model(input_ids=ids[:, :n]).last_hidden_state
            assert rel_err(run(ids[:, :n]), want) <= 1e-4
    assert run.captures == 2
