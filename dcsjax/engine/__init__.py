"""The engine: texts and token ids in, float32 log-probs and generations out, on jitted static-shape batches.

`load` (a `Scorer` from a card, file, directory or hub id), `scorer` (encoding, request builders and the
packed scoring step), `packing` (buckets and rows), `logprobs` (the vocabulary-chunked log-prob kernel),
`generate` (the KV-cache decoding loop), `distributed` (JAX's multi-process runtime). Parameters are placed
on a mesh by `dcsjax.nn.sharding`.
"""
