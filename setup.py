"""The optional C kernels of the delta codec (src/traingym/weights/_native.c). Everything else
is in pyproject.toml. Where no C compiler is found the build goes on without them and the
codec uses its NumPy versions (weights/native.py)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("traingym.weights._native", ["src/traingym/weights/_native.c"],
                             extra_compile_args=["-O3"], libraries=["m"], optional=True)])
