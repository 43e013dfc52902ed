"""Writes a GGUF in another llama.cpp file type with llama.cpp's own quantizer (in process,
through llama-cpp-python), requantizing if the input is already quantized.

Usage: python scripts/ref/quantize.py IN OUT FTYPE   (FTYPE as llama-quantize names it: Q5_K_M, F16)
"""

import os
import sys

import llama_cpp


def main():
    src, dst, ftype = sys.argv[1:4]
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + ftype)
    p.nthread = 2
    p.allow_requantize = True
    part = dst + ".part"
    if llama_cpp.llama_model_quantize(src.encode(), part.encode(), p) != 0:
        sys.exit("llama.cpp could not quantize " + src)
    os.replace(part, dst)


if __name__ == "__main__":
    main()
