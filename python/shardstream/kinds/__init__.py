"""Sample kinds beside the default square image-text one, each a small spec given to
:class:`~shardstream.ShardLoader` as ``sample=``: :class:`NaFlex` (images at their own aspect
ratio as patch sequences, SigLIP 2's NaFlex input) with its batch type :class:`NaFlexBatch`."""

from shardstream.kinds.naflex import NaFlex, NaFlexBatch

__all__ = ["NaFlex", "NaFlexBatch"]
