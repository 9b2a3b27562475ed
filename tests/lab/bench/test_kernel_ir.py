"""The fused kernels' offsets are 64-bit wherever a stride or n multiplies (read from Triton's first IR,
no GPU needed): a 32-bit ``pos * stride`` wraps past 2³¹, which no CI-sized input can show."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nystrom_lab.bench.gpu.kernel_ir import narrow_products

ROOT = Path(__file__).resolve().parents[3]

_SCRIPT = """
import json
from nystrom_lab.bench.gpu.kernel_ir import findings
print(json.dumps({dtype: findings(dtype=dtype) for dtype in ("bf16", "fp32")}))
"""

_IR = """
    %pos = tt.make_range {end = 64 : i32, start = 0 : i32} : tensor<64xi32> loc(#loc1)
    %x_1 = tt.expand_dims %pos {axis = 1 : i32} : tensor<64xi32> -> tensor<64x1xi32> loc(#loc2)
    %x_2 = tt.splat %sqn : i32 -> tensor<64x1xi32> loc(#loc2)
    %x_3 = arith.muli %x_1, %x_2 : tensor<64x1xi32> loc(#loc2)
    %x_4 = tt.splat %m : i32 -> tensor<64x1xi32> loc(#loc3)
    %x_5 = arith.muli %x_1, %x_4 : tensor<64x1xi32> loc(#loc3)
    %x_6 = arith.extsi %x_1 : tensor<64x1xi32> to tensor<64x1xi64> loc(#loc4)
    %x_7 = arith.extsi %x_2 : tensor<64x1xi32> to tensor<64x1xi64> loc(#loc4)
    %x_8 = arith.muli %x_6, %x_7 : tensor<64x1xi64> loc(#loc4)
    %lo = arith.muli %split, %n : i32 loc(#loc5)
"""


def test_narrow_products_flags_32_bit_products_of_strides_and_n_only():
    found = narrow_products(_IR)
    assert [line.split(" = ")[0] for line in found] == ["%x_3", "%lo"]  # not rows·m, not the 64-bit one
    assert "['sqn']" in found[0] and "['n']" in found[1]


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_every_fused_kernel_multiplies_strides_in_64_bits(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # lowered, not interpreted
    env |= {"PYTHONPATH": str(ROOT / "src"), "TRITON_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    for dtype, kernels in result.items():
        assert len(kernels) == 9, dtype
        assert kernels == {name: [] for name in kernels}, dtype
