"""Authenticated requests with mutated JSON (``benchmarks/fuzz_service.py``, a sample).

The benchmark sends 10,000 a mode and prints the README's figures; the suite sends a
few hundred a mode with the same generator and asserts what the figures must show.
"""

from __future__ import annotations

import pytest

from benchmarks.fuzz_service import MODES, fuzz


@pytest.mark.parametrize("mode", sorted(MODES))
def test_fuzzed_requests_get_no_server_error_and_refusals_change_nothing(mode: str) -> None:
    figures = fuzz(mode, 400, seed=11)
    assert figures.server_errors == 0, figures.examples[:5]
    assert figures.changed_on_refusal == 0, figures.examples[:5]
    assert figures.status_strict_json
    # The mutations reach both sides: some leave a valid request, most are refused.
    assert figures.taken > 0 and figures.refused > figures.taken


@pytest.mark.parametrize("codec", ["fp16", "bf16", "topk", "sign"])
@pytest.mark.parametrize("mode", sorted(MODES))
def test_fuzzed_compressed_bodies_get_no_server_error_and_change_nothing(
    mode: str, codec: str
) -> None:
    """The codec's arrays broken (indices out of range or repeated, too many values,
    NaN scales, wrong dtypes and lengths) and copy numbers made up."""
    figures = fuzz(mode, 150, seed=5, codec=codec)
    assert figures.server_errors == 0, figures.examples[:5]
    assert figures.changed_on_refusal == 0, figures.examples[:5]
    assert figures.status_strict_json
    assert figures.taken > 0 and figures.refused > 0
