"""Real runs of PyTorch Lightning's Trainer and Accelerate's prepare() over asyncflow.DataLoader.

Each test trains a tiny model on the CPU and checks, batch by batch, what the framework fed it:
every batch once per epoch, and on resume exactly the batches not yet seen. docs/frameworks.md
cites these tests for each claim it makes.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F

# Imported here, before any Lightning hook runs: see test_lightning_rebuilds_a_hook_loader_*.
from asyncflow import DataLoader
from asyncflow.sources import DistributedSampler

pl = pytest.importorskip("pytorch_lightning")
accelerate = pytest.importorskip("accelerate")

from accelerate.data_loader import DataLoaderShard  # noqa: E402
from accelerate.state import AcceleratorState, GradientState  # noqa: E402
from lightning_fabric.utilities.data import (  # noqa: E402
    _auto_add_worker_init_fn,
    _replace_dunder_methods,
)
from lightning_fabric.utilities.seed import pl_worker_init_function  # noqa: E402
from pytorch_lightning.callbacks import ModelCheckpoint  # noqa: E402
from pytorch_lightning.trainer.connectors.data_connector import (  # noqa: E402
    _get_distributed_sampler,
)
from pytorch_lightning.trainer.states import RunningStage  # noqa: E402
from pytorch_lightning.utilities.data import _update_dataloader  # noqa: E402

ITEMS, BATCH = 64, 8
BATCHES = ITEMS // BATCH
SEED = 1234

pytestmark = [
    pytest.mark.timeout(120),
    # Lightning 2.6.6 flattens every CombinedLoader with a pytree call torch 2.13 deprecates.
    pytest.mark.filterwarnings(r"ignore:`isinstance\(treespec, LeafSpec\)` is deprecated"),
]

Batches = list[tuple[int, ...]]


class Numbered(torch.utils.data.Dataset[dict[str, Any]]):
    """Item ``i`` carries its own index, so a test can tell which batches a model saw."""

    def __len__(self) -> int:
        return ITEMS

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"index": i, "x": torch.full((4,), float(i) / ITEMS), "y": torch.tensor([1.0])}


def make_loader(dataset: Any = None, **kwargs: Any) -> DataLoader:
    options: dict[str, Any] = {"batch_size": BATCH, "shuffle": True, "seed": SEED,
                               "num_workers": 2, "workers": "threads"}
    options.update(kwargs)
    if options.get("sampler") is not None or options.get("batch_sampler") is not None:
        options.pop("shuffle")
        options.pop("seed")
    return DataLoader(Numbered() if dataset is None else dataset, **options)


def indices(batch: dict[str, Any]) -> tuple[int, ...]:
    return tuple(batch["index"].tolist())


def epochs_of(loader: DataLoader, n: int = 2) -> list[Batches]:
    """The batches of epochs ``0 .. n-1`` of ``loader``, as index tuples."""
    epochs = []
    for epoch in range(n):
        loader.set_epoch(epoch)
        epochs.append([indices(b) for b in loader])
    return epochs


def assert_each_item_once(epoch: Batches) -> None:
    assert len(epoch) == BATCHES
    assert sorted(i for batch in epoch for i in batch) == list(range(ITEMS))


# -- PyTorch Lightning -------------------------------------------------------------------


class Recorder(pl.LightningModule):
    """Records the index batches each hook receives, by epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 1)
        self.trained: dict[int, Batches] = {}

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        self.trained.setdefault(self.current_epoch, []).append(indices(batch))
        return F.mse_loss(self.net(batch["x"]), batch["y"])

    def predict_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        return batch["index"]

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Validating(Recorder):
    def __init__(self) -> None:
        super().__init__()
        self.validated: dict[int, Batches] = {}

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self.validated.setdefault(self.current_epoch, []).append(indices(batch))


def trainer(root: Path, max_epochs: int = 2, **kwargs: Any) -> pl.Trainer:
    options: dict[str, Any] = {
        "accelerator": "cpu", "devices": 1, "logger": False, "enable_checkpointing": False,
        "enable_progress_bar": False, "enable_model_summary": False,
        "num_sanity_val_steps": 0, "max_epochs": max_epochs, "default_root_dir": root,
    }
    options.update(kwargs)
    return pl.Trainer(**options)


def test_lightning_fit_feeds_each_batch_once_per_epoch(tmp_path: Path, leak_check: None) -> None:
    expected = epochs_of(make_loader())
    train, val = make_loader(), make_loader(shuffle=False, seed=None)
    model = Validating()
    run = trainer(tmp_path)
    run.fit(model, train_dataloaders=train, val_dataloaders=val)
    # one device, no predict: Lightning iterates the loader it was given, engine and all
    assert run.train_dataloader is train
    assert run.val_dataloaders is val
    assert [model.trained[0], model.trained[1]] == expected
    for epoch in expected:
        assert_each_item_once(epoch)
    assert expected[0] != expected[1]  # reshuffled each epoch
    in_order = [tuple(range(i, i + BATCH)) for i in range(0, ITEMS, BATCH)]
    assert model.validated == {0: in_order, 1: in_order}
    assert run.global_step == 2 * BATCHES
    assert train.stats().delivered == BATCHES  # the last epoch ran on asyncflow's engine


def test_lightning_fit_from_a_dataloader_hook(tmp_path: Path) -> None:
    """Built inside ``train_dataloader()``, the loader's arguments are captured by Lightning."""
    expected = epochs_of(make_loader())

    class FromHook(Recorder):
        def train_dataloader(self) -> DataLoader:
            return make_loader()

    model = FromHook()
    run = trainer(tmp_path)
    run.fit(model)
    assert isinstance(run.train_dataloader, DataLoader)
    assert [model.trained[0], model.trained[1]] == expected


def test_lightning_saves_loader_state_in_checkpoints(tmp_path: Path) -> None:
    train = make_loader()
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=3,
                                  save_top_k=-1)
    trainer(tmp_path, max_epochs=1, enable_checkpointing=True,
            callbacks=[checkpoints]).fit(Recorder(), train_dataloaders=train)
    saved = torch.load(tmp_path / "ckpt" / "epoch=0-step=3.ckpt", weights_only=False)
    loader_states = saved["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    assert len(loader_states) == 1
    resumed = make_loader()
    resumed.load_state_dict(loader_states[0])
    assert [indices(b) for b in resumed] == epochs_of(make_loader(), 1)[0][3:]


def shuffled_by(how: str) -> DataLoader:
    if how == "shuffle":
        return make_loader()
    dataset = Numbered()  # asyncflow's sampler: Lightning calls its set_epoch each epoch
    return make_loader(dataset, sampler=DistributedSampler(dataset, num_replicas=1, rank=0,
                                                           seed=SEED))


@pytest.mark.parametrize("how", ["shuffle", "sampler"])
@pytest.mark.parametrize("step", [3, BATCHES], ids=["mid-epoch", "last-batch"])
def test_lightning_resumes_from_a_step_checkpoint(tmp_path: Path, step: int, how: str) -> None:
    """A checkpoint taken after ``step`` batches (the epoch's last included) holds the
    loader's state; the resumed run goes on with exactly the batches not yet trained on."""
    expected = epochs_of(shuffled_by(how))
    assert expected[0] != expected[1]
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=step,
                                  save_top_k=-1)
    first = Recorder()
    trainer(tmp_path, max_epochs=1, enable_checkpointing=True,
            callbacks=[checkpoints]).fit(first, train_dataloaders=shuffled_by(how))
    assert first.trained == {0: expected[0]}

    (tmp_path / "ckpt").rename(tmp_path / "first")  # the resumed run checkpoints afresh
    model = Recorder()
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=step,
                                  save_top_k=-1)
    run = trainer(tmp_path, enable_checkpointing=True, callbacks=[checkpoints])
    run.fit(model, train_dataloaders=shuffled_by(how),
            ckpt_path=tmp_path / "first" / f"epoch=0-step={step}.ckpt")
    resumed = {0: expected[0][step:], 1: expected[1]}
    assert model.trained == {epoch: b for epoch, b in resumed.items() if b}
    assert run.global_step == 2 * BATCHES


@pytest.mark.parametrize("how", ["shuffle", "sampler"])
def test_lightning_resumes_from_an_epoch_end_checkpoint(tmp_path: Path, how: str) -> None:
    """Lightning does not load the loader's state from an epoch-end checkpoint: it sets the
    sampler's epoch, which the loader's order follows (it is drawn at the first batch)."""
    expected = epochs_of(shuffled_by(how))
    assert expected[0] != expected[1]
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1)
    first = Recorder()
    trainer(tmp_path, max_epochs=1, enable_checkpointing=True,
            callbacks=[checkpoints]).fit(first, train_dataloaders=shuffled_by(how))
    assert first.trained == {0: expected[0]}

    (tmp_path / "ckpt").rename(tmp_path / "first")
    model = Recorder()
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1)
    run = trainer(tmp_path, enable_checkpointing=True, callbacks=[checkpoints])
    run.fit(model, train_dataloaders=shuffled_by(how),
            ckpt_path=tmp_path / "first" / f"epoch=0-step={BATCHES}.ckpt")
    assert model.trained == {1: expected[1]}
    assert run.global_step == 2 * BATCHES


def test_lightning_predict_reinstantiates_the_loader(tmp_path: Path) -> None:
    loader = make_loader(shuffle=False, seed=None, max_failures=2,
                         multiprocessing_context="forkserver")
    run = trainer(tmp_path)
    predictions = run.predict(Recorder(), dataloaders=loader)
    assert predictions is not None
    assert torch.cat(predictions).tolist() == list(range(ITEMS))  # type: ignore[arg-type]
    rebuilt = run.predict_dataloaders
    # a new asyncflow loader over Lightning's index-tracking batch sampler, extras kept
    assert isinstance(rebuilt, DataLoader)
    assert rebuilt is not loader
    assert type(rebuilt.batch_sampler).__name__ == "_IndexBatchSamplerWrapper"
    assert (rebuilt.workers, rebuilt.max_failures) == ("threads", 2)
    assert rebuilt.batch_sampler.seen_batch_indices == [
        list(range(i, i + BATCH)) for i in range(0, ITEMS, BATCH)
    ]


@pytest.mark.parametrize("shuffle", [False, True], ids=["in-order", "shuffled"])
@pytest.mark.parametrize("built_in_hook", [False, True], ids=["attributes", "hook"])
def test_lightning_update_dataloader_injects_a_distributed_sampler(built_in_hook: bool,
                                                                   shuffle: bool) -> None:
    """What Lightning does under DDP: rebuild the loader around a DistributedSampler, from
    its attributes, or from the arguments it recorded when a ``*_dataloader`` hook built it."""
    dataset = Numbered()
    options: dict[str, Any] = {"max_failures": 2, "multiprocessing_context": "forkserver"}
    if not shuffle:
        options.update(shuffle=False, seed=None)
    if built_in_hook:  # as Lightning calls the hooks: recording each DataLoader's arguments
        with _replace_dunder_methods(torch.utils.data.DataLoader, "dataset"), \
                _replace_dunder_methods(torch.utils.data.BatchSampler):
            loader = make_loader(dataset, **options)
    else:
        loader = make_loader(dataset, **options)
    sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=2, rank=0,
                                                  shuffle=shuffle, seed=SEED)
    rebuilt = _update_dataloader(loader, sampler, mode=RunningStage.TRAINING)
    assert isinstance(rebuilt, DataLoader)
    assert rebuilt.sampler is sampler
    assert (rebuilt.batch_size, rebuilt.num_workers, rebuilt.workers, rebuilt.max_failures) == (
        BATCH, 2, "threads", 2
    )
    rank0 = list(sampler)
    assert rank0 == list(range(ITEMS))[::2] or shuffle
    assert [indices(b) for b in rebuilt] == [
        tuple(rank0[i : i + BATCH]) for i in range(0, len(rank0), BATCH)
    ]


def test_lightning_ddp_rebuilds_the_loader_for_each_rank(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Under DDP, ``fit`` rebuilds each rank's loader around a DistributedSampler (nothing is
    launched here: the trainer is rank 0 of 2, and rank 1's step is taken by hand)."""
    monkeypatch.setenv("PL_GLOBAL_SEED", "7")  # what seed_everything(7) sets
    loader = make_loader()
    connector = trainer(tmp_path, devices=2, strategy="ddp")._data_connector
    rank0 = connector._prepare_dataloader(loader, shuffle=True, mode=RunningStage.TRAINING)
    sampler = _get_distributed_sampler(loader, shuffle=True, overfit_batches=0,
                                       num_replicas=2, rank=1)
    rank1 = _update_dataloader(loader, sampler, mode=RunningStage.TRAINING)
    shares = []
    for rebuilt in (rank0, rank1):
        assert isinstance(rebuilt, DataLoader)
        assert type(rebuilt.sampler) is torch.utils.data.DistributedSampler
        order = list(rebuilt.sampler)
        assert [indices(b) for b in rebuilt] == [
            tuple(order[i : i + BATCH]) for i in range(0, len(order), BATCH)
        ]
        shares.append(order)
    assert len(shares[0]) == len(shares[1]) == ITEMS // 2
    assert sorted(shares[0] + shares[1]) == list(range(ITEMS))
    assert shares[0] == list(torch.utils.data.DistributedSampler(
        Numbered(), num_replicas=2, rank=0, shuffle=True, seed=7))  # not the loader's seed=


class RankRecorder(Recorder):
    """Builds its loader in the hook, in each rank's process, and writes what it trained on."""

    def __init__(self, out: Path) -> None:
        super().__init__()
        self.out = out

    def train_dataloader(self) -> DataLoader:
        return make_loader()

    def on_train_end(self) -> None:
        loader = self.trainer.train_dataloader
        self.out.joinpath(f"rank{self.global_rank}.json").write_text(json.dumps({
            "trained": self.trained, "sampler": type(loader.sampler).__name__,
            "loader": f"{type(loader).__module__}.{type(loader).__qualname__}",
        }))
        # Lightning destroys only NCCL's process group at exit; gloo's, left up, once aborted
        # a rank's interpreter as it exited ("terminate called without an active exception").
        atexit.register(_destroy_process_group)


def _destroy_process_group() -> None:
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_lightning_ddp_spawn_trains_each_rank_on_its_share(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two real DDP ranks (gloo, spawned processes): each rank's loader, built in the hook and
    rebuilt by Lightning around a DistributedSampler, feeds that rank its share, each epoch."""
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)  # the samplers' seed: 0
    environ = dict(os.environ)
    try:
        trainer(tmp_path, devices=2, strategy="ddp_spawn").fit(RankRecorder(tmp_path))
    finally:  # the launcher sets MASTER_PORT in this process's environment
        os.environ.clear()
        os.environ.update(environ)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank, report in enumerate(ranks):
        assert report["loader"] == f"{DataLoader.__module__}.DataLoader"
        assert report["sampler"] == "DistributedSampler"
        sampler = torch.utils.data.DistributedSampler(Numbered(), num_replicas=2, rank=rank,
                                                      shuffle=True, seed=0)
        for epoch in (0, 1):
            sampler.set_epoch(epoch)
            share = list(sampler)
            assert [tuple(b) for b in report["trained"][str(epoch)]] == [
                tuple(share[i : i + BATCH]) for i in range(0, len(share), BATCH)
            ]
    for epoch in ("0", "1"):
        items = [i for report in ranks for b in report["trained"][epoch] for i in b]
        assert sorted(items) == list(range(ITEMS))


# A script's own first use of asyncflow.DataLoader inside a hook, in a fresh interpreter.
FRESH_SCRIPT = """
import sys
import torch
import pytorch_lightning as pl
import asyncflow
if sys.argv[1] == "early":
    from asyncflow import DataLoader  # the class exists before Lightning patches __init__


class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(1, 1)

    def predict_step(self, batch, batch_idx):
        return batch

    def predict_dataloader(self):
        return asyncflow.DataLoader(list(range(64)), batch_size=8, num_workers=2,
                                    workers="threads")


trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                     enable_model_summary=False)
predictions = trainer.predict(Model())
assert torch.cat(predictions).tolist() == list(range(64))
rebuilt = trainer.predict_dataloaders
assert type(rebuilt) is asyncflow.DataLoader
assert (rebuilt.num_workers, rebuilt.workers) == (2, "threads")
"""


@pytest.mark.slow
@pytest.mark.parametrize("first_use", ["early", "in-hook"])
def test_lightning_rebuilds_a_hook_loader_in_a_fresh_process(tmp_path: Path,
                                                             first_use: str) -> None:
    """Lightning records the arguments of the loaders a hook builds by patching the
    ``__init__`` of every DataLoader class that exists when it calls the hook; ``import
    asyncflow`` creates ``asyncflow.DataLoader`` only at its first use."""
    script = tmp_path / "predict.py"
    script.write_text(FRESH_SCRIPT)
    result = subprocess.run(
        [sys.executable, str(script), first_use], cwd=tmp_path, capture_output=True,
        text=True, timeout=100,
    )
    assert result.returncode == 0, result.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("use_distributed_sampler", [True, False])
def test_lightning_ddp_and_asyncflow_distributed_sampler(tmp_path: Path,
                                                         use_distributed_sampler: bool) -> None:
    """Lightning only recognises torch's DistributedSampler: it wraps asyncflow's in another
    one, sharding twice, unless ``use_distributed_sampler=False``."""
    connector = trainer(tmp_path, devices=2, strategy="ddp",
                        use_distributed_sampler=use_distributed_sampler)._data_connector
    dataset = Numbered()
    sampler = DistributedSampler(dataset, num_replicas=2, rank=0, shuffle=False)
    loader = make_loader(dataset, sampler=sampler)
    prepared = connector._prepare_dataloader(loader, shuffle=True, mode=RunningStage.TRAINING)
    items = sorted(i for b in prepared for i in indices(b))
    if use_distributed_sampler:
        assert prepared is not loader
        assert len(items) == ITEMS // 4  # rank 0's half of rank 0's half
    else:
        assert prepared is loader
        assert items == list(range(0, ITEMS, 2))


@pytest.mark.slow
def test_lightning_seed_workers_sets_worker_init_fn_after_construction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``seed_everything(workers=True)`` makes Lightning assign ``loader.worker_init_fn`` after
    the loader is built; torch calls whatever it holds when an epoch starts its workers."""
    monkeypatch.setenv("PL_SEED_WORKERS", "1")
    # a list and a lambda go to the worker processes by value: they need not import this module
    items = [{"index": i} for i in range(ITEMS)]
    loader = make_loader(items, workers="processes", shuffle=False, seed=None)
    _auto_add_worker_init_fn(loader, rank=0)
    assert loader.worker_init_fn.func is pl_worker_init_function  # type: ignore[union-attr]
    loader.worker_init_fn = lambda worker_id: (tmp_path / f"worker{worker_id}").touch()
    assert sorted(i for b in loader for i in indices(b)) == list(range(ITEMS))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["worker0", "worker1"]


# -- Hugging Face Accelerate -------------------------------------------------------------


def reset_accelerate() -> None:
    """Forget the process-wide state a former Accelerator left, as a new process would."""
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


@pytest.fixture
def fresh_accelerate() -> Iterator[None]:
    reset_accelerate()
    yield
    reset_accelerate()


def model_and_optimizer() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def train_steps(accelerator: Any, model: nn.Module, optimizer: torch.optim.Optimizer,
                batches: Iterable[dict[str, Any]]) -> Batches:
    seen = []
    for batch in batches:
        seen.append(indices(batch))
        loss = F.mse_loss(model(batch["x"]), batch["y"])
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    return seen


@pytest.mark.parametrize("num_workers", [0, 2])
def test_accelerate_prepare_rebuilds_the_loader_and_trains(fresh_accelerate: None,
                                                           num_workers: int) -> None:
    expected = epochs_of(make_loader())
    accelerator = accelerate.Accelerator(cpu=True)
    loader = make_loader(num_workers=num_workers)
    model, optimizer, prepared = accelerator.prepare(*model_and_optimizer(), loader)
    # prepare() builds torch's own DataLoader over the loader's dataset and batch sampler
    assert isinstance(prepared, DataLoaderShard)
    assert type(prepared.base_dataloader) is torch.utils.data.DataLoader
    assert not isinstance(prepared, DataLoader)
    assert prepared.batch_sampler is loader.batch_sampler
    assert prepared.num_workers == num_workers
    seen = [train_steps(accelerator, model, optimizer, prepared) for _ in range(2)]
    assert expected[0] != expected[1]
    assert seen == expected  # the same batches, in the same order, from torch's engine
    assert loader.stats().delivered == 0  # asyncflow's engine ran no epoch


def test_accelerate_resumes_with_skip_first_batches(tmp_path: Path,
                                                    fresh_accelerate: None) -> None:
    expected = epochs_of(make_loader())
    accelerator = accelerate.Accelerator(cpu=True)
    model, optimizer, prepared = accelerator.prepare(*model_and_optimizer(), make_loader())
    batches = iter(prepared)
    first = train_steps(accelerator, model, optimizer, (next(batches) for _ in range(3)))
    accelerator.save_state(tmp_path / "state")
    del batches
    reset_accelerate()

    accelerator = accelerate.Accelerator(cpu=True)
    model, optimizer, prepared = accelerator.prepare(*model_and_optimizer(), make_loader())
    accelerator.load_state(tmp_path / "state")
    rest = train_steps(accelerator, model, optimizer, accelerator.skip_first_batches(prepared, 3))
    assert first + rest == expected[0]
    prepared.set_epoch(1)  # a new process's prepared loader starts from epoch 0 otherwise
    assert train_steps(accelerator, model, optimizer, prepared) == expected[1]


def engine_loader(accelerator: Any) -> DataLoader:
    """asyncflow's engine under Accelerate: no prepare(), this process's share by hand."""
    dataset = Numbered()
    sampler = DistributedSampler(dataset, num_replicas=accelerator.num_processes,
                                 rank=accelerator.process_index, shuffle=True, seed=SEED)
    return make_loader(dataset, sampler=sampler, device=accelerator.device)


def test_accelerate_keeps_the_engine_and_resumes_exactly(tmp_path: Path, leak_check: None,
                                                         fresh_accelerate: None) -> None:
    accelerator = accelerate.Accelerator(cpu=True)
    expected = epochs_of(engine_loader(accelerator))
    assert expected[0] != expected[1]
    loader = engine_loader(accelerator)
    model, optimizer = accelerator.prepare(*model_and_optimizer())
    accelerator.register_for_checkpointing(loader)
    loader.set_epoch(0)
    batches = iter(loader)
    first = next(batches)
    assert first["x"].device == accelerator.device
    seen = [indices(first)]
    seen += train_steps(accelerator, model, optimizer, (next(batches) for _ in range(2)))
    accelerator.save_state(tmp_path / "state")
    batches.close()
    reset_accelerate()

    accelerator = accelerate.Accelerator(cpu=True)
    loader = engine_loader(accelerator)
    model, optimizer = accelerator.prepare(*model_and_optimizer())
    accelerator.register_for_checkpointing(loader)
    accelerator.load_state(tmp_path / "state")
    assert loader.state_dict()["epoch"] == 0  # where a training loop goes on from
    loader.set_epoch(0)
    rest = train_steps(accelerator, model, optimizer, loader)
    assert seen + rest == expected[0]
    loader.set_epoch(1)
    assert train_steps(accelerator, model, optimizer, loader) == expected[1]
    assert loader.stats().delivered == len(expected[1])  # on asyncflow's engine


# -- docs/frameworks.md --------------------------------------------------------------------

PAGE = Path(__file__).resolve().parents[2] / "docs" / "frameworks.md"


def test_the_frameworks_page_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  fresh_accelerate: None) -> None:
    """The page's code blocks, run in order as one script, each Accelerate part afresh."""
    blocks = re.findall(r"^```python\n(.*?)^```", PAGE.read_text(), flags=re.S | re.M)
    assert len(blocks) == 6
    monkeypatch.chdir(tmp_path)  # Lightning's checkpoints, Accelerate's "checkpoint"
    # Lightning's progress bar would start tqdm's monitor thread, which outlives the test:
    # later DataLoaders would find another Python thread and start from the forkserver
    from tqdm.std import tqdm

    monkeypatch.setattr(tqdm, "monitor_interval", 0)
    namespace: dict[str, Any] = {"__name__": "frameworks_page"}
    for number, block in enumerate(blocks):
        if "Accelerator(" in block:
            reset_accelerate()
        exec(compile(block, f"{PAGE.name} block {number}", "exec"), namespace)
    assert namespace["trainer"].global_step == 2 * BATCHES
