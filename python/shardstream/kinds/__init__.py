"""Sample kinds: one pipeline, several kinds of sample.

Reading, sources, fault handling, the index and the plan's arithmetic are shared by every kind;
a kind owns only what turns a raw sample into its part of a batch, and its batch layout.

- The square image-text kind is :class:`shardstream.ShardLoader` itself.
- :mod:`shardstream.kinds.text`: text documents tokenized and packed into token rows
  (:class:`~shardstream.kinds.text.TextLoader`), planned by token positions
  (:func:`~shardstream.kinds.text.count_tokens` counts them once).

A kind that keeps the sample plan (one sample, one slot) is a ``sample=`` spec of
:class:`~shardstream.ShardLoader`; a kind with its own plan (packing: rows cut across documents)
is its own small loader class.
"""
