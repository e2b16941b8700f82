"""A copy of the installed onnxruntime that believes the CPU lacks AVX-512.

ONNX Runtime picks its kernels from CPUID and XGETBV at start-up and has no
switch to stop at AVX2, so comparing recall's AVX2 kernels with ONNX
Runtime's on an AVX-512 machine needs this: every XGETBV in the copy's
shared libraries is replaced by `push 7; pop rax` (3 bytes for 3 bytes),
which reports the OS saving only x87, SSE and AVX state. Without the
AVX-512 state bits ONNX Runtime, like any careful program, keeps to AVX2.

    python scripts/ort_avx2.py OUT_DIR
    RECALL_MATMUL=avx2 RECALL_Q8=avx2 PYTHONPATH=OUT_DIR \\
        python scripts/bench_peers.py models/bge-m3-random --peers ort,ort-int8

Check that it took: ONNX Runtime int8 falls to about half its AVX-512 VNNI
speed. The replacement is blind (the byte pattern could also sit in data:
compare the count with `objdump -d LIB | grep -c xgetbv`; 15 and 16 in
onnxruntime 1.32's two libraries, as found), `push` writes below the stack
pointer and EDX is left as it was: a measuring aid only, never install it.
"""

import shutil
import sys
from pathlib import Path

XGETBV = bytes([0x0F, 0x01, 0xD0])
PUSH_7_POP_RAX = bytes([0x6A, 0x07, 0x58])


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: python scripts/ort_avx2.py OUT_DIR")
    import onnxruntime

    source = Path(onnxruntime.__file__).parent
    target = Path(sys.argv[1]) / "onnxruntime"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source, target)
    patched = 0
    for lib in target.rglob("*.so*"):
        data = lib.read_bytes()
        count = data.count(XGETBV)
        if count:
            lib.write_bytes(data.replace(XGETBV, PUSH_7_POP_RAX))
            patched += count
    if patched == 0:
        sys.exit(f"no XGETBV found under {target}: this onnxruntime build is not the expected one")
    print(f"{target}: {patched} XGETBV patched (onnxruntime {onnxruntime.__version__}); use PYTHONPATH={sys.argv[1]}")


if __name__ == "__main__":
    main()
