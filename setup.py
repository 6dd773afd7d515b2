"""The project's metadata is in pyproject.toml; this adds the optional C speed-ups.

``optional=True``: where no C compiler is found, the install goes on without them and the
same work runs in Python and numpy (each caller falls back by itself). No FMA contraction:
the compiled loops repeat Python's float arithmetic bit for bit.
"""

from setuptools import Extension, setup

FLAGS = ["-O2", "-ffp-contract=off", "-fno-fast-math"]

setup(ext_modules=[
    Extension("schedsim.run._csv_rows", ["schedsim/run/_csv_rows.c"], optional=True, extra_compile_args=FLAGS),
    Extension("schedsim.core._queue_run", ["schedsim/core/_queue_run.c"], optional=True, extra_compile_args=FLAGS),
])
