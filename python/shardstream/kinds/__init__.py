"""Sample kinds: one pipeline, several kinds of sample.

Reading, sources, fault handling, the index and the plan's arithmetic are shared by every kind;
a kind owns only what turns a raw sample into its part of a batch, and its batch layout.

- The square image-text kind is :class:`shardstream.ShardLoader` itself.
- :class:`NaFlex` (``ShardLoader(..., sample=NaFlex(...))``): images at their own aspect ratio
  as SigLIP 2 patch sequences, with its batch type :class:`NaFlexBatch`; its token-budget
  batches (as many images as fit a patch budget, by length bucket) are
  :class:`~shardstream.kinds.naflex_budget.NaFlexBudgetLoader`, planned by batches per unit
  (:func:`~shardstream.kinds.naflex_budget.count_patches` counts them once).
- :mod:`shardstream.kinds.text`: text documents tokenized and packed into token rows
  (:class:`~shardstream.kinds.text.TextLoader`), planned by token positions
  (:func:`~shardstream.kinds.text.count_tokens` counts them once).
- :mod:`shardstream.kinds.video`: video-text CLIP clips decoded at their sampled frames
  (:class:`~shardstream.kinds.video.VideoLoader`), planned by clips per unit
  (:func:`~shardstream.kinds.video.count_clips` counts them once).

A kind that keeps the sample plan (one sample, one slot) is a ``sample=`` spec of
:class:`~shardstream.ShardLoader`; a kind with its own plan (packing: rows cut across documents)
is its own small loader class.
"""

from shardstream.kinds.naflex import NaFlex, NaFlexBatch

__all__ = ["NaFlex", "NaFlexBatch"]
