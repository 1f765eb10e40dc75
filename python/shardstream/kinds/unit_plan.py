"""What the kinds planned over units by weight share: the text kind (tokens per unit) and the
NaFlex kind's token-budget batches (batches per unit). The Rust core's ``plan::unit_stream`` cuts the
epoch's stream of positions (units in a seeded order, each its weight long) into equal shares
per rank and DataLoader worker; this class holds the Python side of that plan on top of
:class:`~shardstream._loader_base.LoaderBase` (rank and world, epochs, workers, buffers): ``len()``
and the resume state (phases of batches done, re-planned onto another shape by arithmetic).

A subclass names its counts class (``_counts_type``, a
:class:`~shardstream.kinds.counts_file.CountsFile`); its constructor calls
:meth:`UnitPlanLoader._load_counts` (the counts given, or loaded from a path), checks what it
needs of them, calls :meth:`UnitPlanLoader._start_plan` (the seed, the loader's rank, threads and
buffers, then the units, their weights and how their files are opened) and, once it knows its
shape, :meth:`UnitPlanLoader._require_a_batch_per_rank`; and it gives ``_shape()``,
``_layout()``, ``_iterate()`` (its reader's batches, in order) and ``stats``.

A mixture (:class:`~shardstream.kinds.row_mixture.RowMixture`) may end its sources' epochs
early: it sets ``_epoch_batches``, which gives the batches per rank its epoch has on the world
size of the epoch's first phase, and the source then plans its stream only up to there, so that
every position it plans is read (its documents cut by that end are the pipeline's business).
After a resume onto another world size, what is left of that stream seldom divides among the
new ranks: a kind whose documents must be read whole (``_pads_later_phases``) then reads every
position left, the ranks short of a batch getting one of padding (the core's
``plan::unit_stream::Rest::Padded``); the others leave those positions as the phase's remainder.
"""

from __future__ import annotations

from typing import Any, ClassVar

from shardstream import _core
from shardstream._loader_base import LoaderBase
from shardstream.config import SourceOptions
from shardstream.kinds.counts_file import CountsFile

STATE_FORMAT = "shardstream-packed-state"
STATE_VERSION = 1

Shape = tuple[int, int, int, int, int]


class UnitPlanLoader(LoaderBase):
    """Base of the loaders planned over unit weights (see the module's documentation)."""

    # Workers read the epoch and the resume position when they start: one pass each.
    _min_workers = 1
    _persistent_workers = False

    #: The kind's counts class: what ``counts`` is, or is loaded as from a path.
    _counts_type: ClassVar[type[CountsFile]]
    counts: Any
    seed: int
    #: The units as the core takes them: (url, first row, rows or None, identity or None).
    _units: list[tuple[str, int, Any, Any]]
    #: Each unit's weight (the counts' ``WEIGHT``: tokens or batches), and their sum.
    _weights: list[int]
    _total: int
    #: Set by a mixture: its batches per rank on a world size (see the module's documentation).
    _epoch_batches: Any = None
    #: Whether, as a mixture's source, phases after the first read every position left (the
    #: ranks short of a batch padded) rather than leave a remainder: for kinds whose documents
    #: span batches and must be learned whole.
    _pads_later_phases = False

    def _shape(self) -> Shape:
        raise NotImplementedError

    def _load_counts(self, counts: Any) -> Any:
        """Sets ``counts``: ``counts`` itself when it is of the kind's counts class, else the
        counts loaded from that path; returns them."""
        kind = self._counts_type
        self.counts = counts if isinstance(counts, kind) else kind.load(counts)
        return self.counts

    def _start_plan(
        self,
        seed: int,
        rank: int | None,
        world_size: int | None,
        threads: int | None,
        prefetch: int,
        pin_memory: bool | None,
        source: SourceOptions | None,
    ) -> dict[str, Any]:
        """The constructor's part every such loader shares, after its counts are loaded and
        checked: sets ``seed``, starts the loader (rank, world, threads, buffers) and reads the
        counts' units (:meth:`_read_units`); returns the source configuration the core opens the
        units with."""
        self.seed = seed
        self._init_loader(rank, world_size, threads, prefetch, pin_memory)
        return self._read_units(source)

    def _read_units(self, source: SourceOptions | None) -> dict[str, Any]:
        """Takes the counts' units and weights (``_units``, ``_weights``, ``_total``, summed once:
        frameworks call ``len()`` often) and returns the source configuration the core opens
        them with. Only signed sources (``s3://``, ``hf://``) have their URLs expanded again, for
        their signer and CA bundle: local and http(s) files open as they are, so 100k local files
        cost nothing here."""
        from shardstream.urls import expand_urls, source_config

        c = self.counts
        options = (source or SourceOptions()).keywords()
        signed = sorted({u["url"] for u in c.units if u["url"].startswith(("s3://", "hf://"))})
        shards = expand_urls(signed, **{**options, "check": "none"}) if signed else []
        self._units = [(u["url"], int(u["first_row"]), u["rows"], u["identity"]) for u in c.units]
        self._weights = [int(u[c.WEIGHT]) for u in c.units]
        self._total = sum(self._weights)
        return source_config(shards, options)

    def _require_a_batch_per_rank(self, detail: str) -> None:
        """Refuses a fresh epoch in which a rank would get no batch (``detail`` says why)."""
        if len(self) == 0 and self._resume is None:
            raise ValueError(detail)

    def _phases(self) -> list[tuple[Shape, int]]:
        """The resume state's phases (empty for a fresh epoch)."""
        if self._resume is None:
            return []
        return [(tuple(p["shape"]), int(p["batches_done"])) for p in self._resume["phases"]]  # type: ignore[misc]

    def _stream_end(self) -> int:
        """Where this epoch's plan ends: the units' whole weight, or a mixture's end (its
        batches per rank on the first phase's world size, in this loader's batches)."""
        if self._epoch_batches is None:
            return self._total
        phases = self._phases()
        first = phases[0][0] if phases else self._shape()
        world, batch_weight = first[0], first[2] * first[3]
        return min(self._total, int(self._epoch_batches(world)) * world * batch_weight)

    def _batches_on(self, world: int) -> int:
        """Batches per rank a fresh epoch on ``world`` ranks would have (for a mixture)."""
        shape = self._shape()
        return self._total // (world * shape[2] * shape[3])

    def _end(self) -> tuple[int, bool]:
        """(the stream's planned end, whether later phases are padded): the core's ``PlanEnd``."""
        return (self._stream_end(), self._epoch_batches is not None and self._pads_later_phases)

    def _reader(self, worker: int) -> tuple[Any, ...]:
        """Which reader of which epoch's plan the pipeline of DataLoader worker ``worker`` is:
        (seed, epoch, phases, current shape, rank, worker, the stream's end)."""
        return (self.seed, self.epoch, self._phases(), self._shape(), self.rank, worker, self._end())

    def _plan_counts(self) -> tuple[int, int, int, int]:
        """(batches per rank left, the phase's batches per rank, remainder, padding)."""
        return _core.packed_plan_counts(self._end(), self.seed, self.epoch, self._phases(), self._shape())

    def _unread_weight(self) -> int:
        """The epoch's weight no rank reads: the plan's remainder, and the stream past a
        mixture's end."""
        return self._plan_counts()[2] + self._total - self._stream_end()

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
