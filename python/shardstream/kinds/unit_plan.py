"""What the kinds planned over units by weight share: the text kind (tokens per unit) and the
NaFlex kind's token-budget batches (batches per unit). The Rust core's ``plan::packed`` cuts the
epoch's stream of positions (units in a seeded order, each its weight long) into equal shares
per rank and DataLoader worker; this class holds the Python side of that plan on top of
:class:`~shardstream._loader_base.LoaderBase` (rank and world, epochs, workers, buffers): ``len()``
and the resume state (phases of batches done, re-planned onto another shape by arithmetic).

A subclass sets ``_total`` (the sum of the units' weights) and ``counts`` (with ``identity()``),
and gives ``_shape()``, ``_layout()``, ``_iterate()`` (its reader's batches, in order) and
``stats``.
"""

from __future__ import annotations

from typing import Any

from shardstream import _core
from shardstream._loader_base import LoaderBase

STATE_FORMAT = "shardstream-packed-state"
STATE_VERSION = 1

Shape = tuple[int, int, int, int, int]


class UnitPlanLoader(LoaderBase):
    """Base of the loaders planned over unit weights (see the module's documentation)."""

    # Workers read the epoch and the resume position when they start: one pass each.
    _min_workers = 1
    _persistent_workers = False

    counts: Any
    seed: int
    _total: int

    def _shape(self) -> Shape:
        raise NotImplementedError

    def _phases(self) -> list[tuple[Shape, int]]:
        """The resume state's phases (empty for a fresh epoch)."""
        if self._resume is None:
            return []
        return [(tuple(p["shape"]), int(p["batches_done"])) for p in self._resume["phases"]]  # type: ignore[misc]

    def _reader(self, worker: int) -> tuple[int, int, list[tuple[Shape, int]], Shape, int, int]:
        """Which reader of which epoch's plan the pipeline of DataLoader worker ``worker`` is:
        (seed, epoch, phases, current shape, rank, worker)."""
        return (self.seed, self.epoch, self._phases(), self._shape(), self.rank, worker)

    def _plan_counts(self) -> tuple[int, int, int]:
        return _core.packed_plan_counts(self._total, self.seed, self.epoch, self._phases(), self._shape())

    def __len__(self) -> int:
        """Batches this rank yields in the current pass (after a resume: those left)."""
        return self._plan_counts()[0]

    # -- resume --------------------------------------------------------------------------
    def state_dict(self, batches: int | None = None, *, gather: bool = False) -> dict[str, Any]:
        """The position after the batches yielded so far (or ``batches``): small,
        JSON-serialisable and the same on every rank (every rank yields the same batches), so
        rank 0 can save it. ``gather`` is accepted for the framework adapters and does nothing:
        an epoch planned over unit weights has no per-rank reserve to collect.

        Args:
            batches: The batches consumed so far; default: those this loader yielded.
            gather: Ignored (see above).

        Returns:
            The state, for :meth:`load_state_dict`.
        """
        del gather
        done = self._batches_consumed(batches)
        phases = [dict(p) for p in self._resume["phases"]] if self._resume is not None else []
        shape = list(self._shape())
        if phases and list(phases[-1]["shape"]) == shape:
            phases[-1]["batches_done"] = int(phases[-1]["batches_done"]) + done
        else:
            phases.append({"shape": shape, "batches_done": done})
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "counts": self.counts.identity(),
            "seed": self.seed,
            "epoch": self.epoch,
            "phases": phases,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continues the epoch of ``state`` at the exact next position; with another world size
        or shape, the rest of the epoch is re-planned so that every position left is read exactly
        once.

        Args:
            state: What :meth:`state_dict` returned (on any rank).

        Raises:
            ValueError: the state is not such a loader's, or was saved over other counts or
                another seed.
        """
        name = type(self).__name__
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ValueError(f"not a {name} state (no format {STATE_FORMAT!r})")
        if state.get("version") != STATE_VERSION:
            version = state.get("version")
            raise ValueError(f"{name} state version {version}, this package reads {STATE_VERSION}")
        if state["counts"] != self.counts.identity():
            raise ValueError(
                "this state was saved over other token counts or patch counts (another corpus, "
                "tokenizer or budget)"
            )
        if int(state["seed"]) != self.seed:
            raise ValueError(f"this state was saved with seed {state['seed']}, the loader has {self.seed}")
        self.epoch = int(state["epoch"])
        self._load_position({"epoch": self.epoch, "phases": [dict(p) for p in state["phases"]]})
        self._plan_counts()  # a state that does not fit the counts fails here, not mid-pass
