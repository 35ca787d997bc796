"""Upstream's own backends under refimpl's tools: ``sglang`` (SGLang 0.5.23's attention backends, an optional extra
that needs its unpacked wheel: ``scripts/fetch_sglang.sh``). Importing ``refimpl.adapters`` imports no upstream code."""
