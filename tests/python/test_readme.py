"""The README's Python example runs as written (on the GPU where metrale can use one, else on
the CPU backend) and its decode matches the reference."""

import pathlib
import re

import pytest

torch = pytest.importorskip("torch")

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def _first_python_block() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README.md has no python block"
    return blocks[0]


def test_readme_example_runs_and_decodes():
    import numpy as np
    import metrale_ref as ref

    scope = {}
    exec(compile(_first_python_block(), str(README), "exec"), scope)
    out, q, cache = scope["out"], scope["q"], scope["cache"]
    assert tuple(out.shape) == (4, 32, 128) and out.dtype == torch.bfloat16
    host = lambda t: np.asarray(t.cpu() if hasattr(t, "cpu") else t)  # noqa: E731  (torch or NumPy pages)
    s, lay = cache.scales(0), cache.layout
    kf = ref.dequant_cache("nvfp4", host(cache.k(0)), lay, global_scale=s["k_global_scale"])
    vf = ref.dequant_cache("nvfp4", host(cache.v(0)), lay, global_scale=s["v_global_scale"])
    q_bits = host(q.view(torch.int16)).view(np.uint16)
    want = ref.decode_ref(q_bits, kf, vf, host(scope["tables"]), host(scope["lens"]), lay.block_size,
                          1.0 / np.sqrt(128))
    got = ref.bf16_value(host(out.view(torch.int16)).view(np.uint16))
    assert np.isfinite(got).all()
    assert ref.rel_err_blocks(got, want) <= 1e-2
