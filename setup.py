"""The optional C kernels: the delta codec's (src/traingym/weights/_native.c) and the MoE
decode's experts (src/traingym/rollout/_amx.c). Everything else is in pyproject.toml.
Where no C compiler is found the build goes on without them: the codec uses its NumPy versions
(weights/native.py) and the MoE decode its oneDNN path (rollout/fused_moe.py)."""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("traingym.weights._native", ["src/traingym/weights/_native.c"],
              extra_compile_args=["-O3"], libraries=["m"], optional=True),
    Extension("traingym.rollout._amx", ["src/traingym/rollout/_amx.c"],
              extra_compile_args=["-O3", "-fopenmp"], extra_link_args=["-fopenmp"],
              libraries=["m"], optional=True),
])
