"""directload: GPU-centric feature loading for mini-batch GNN training."""

from pathlib import Path

from setuptools import setup

setup(
    name="directload",
    version="0.1.0",
    description="Zero-copy, aligned GPU gathers of GNN node features from host memory and SSD",
    long_description=(Path(__file__).parent / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    python_requires=">=3.11,<3.12",
    # kernels/ and loaders/ install as directload.kernels and directload.loaders,
    # so nothing lands under a generic top-level name.
    packages=["directload", "directload.kernels", "directload.loaders"],
    package_dir={
        "directload": "directload",
        "directload.kernels": "kernels",
        "directload.loaders": "loaders",
    },
    package_data={"directload.kernels": ["cuda/*.cu", "cuda/*.h", "cuda/*.cpp"]},
    install_requires=[
        # torch 2.2.1 is the newest torch with DGL 2.1.0's native libraries.
        "torch==2.2.1",
        "dgl==2.1.0",
        "numpy>=1.24,<2",
        "numba==0.68.1",
        "numba-cuda==0.30.4",
        # CuPy 14 pulls numpy 2, which breaks torch 2.2.
        "cupy-cuda12x>=13,<14",
        "ogb==1.3.6",
        "torchdata==0.7.1",
        # DGL imports setuptools.extern at run time.
        "setuptools<70",
        "pyyaml",
        "pydantic",
        # libNVVM for numba.cuda.compile_ptx on a machine without a CUDA toolkit.
        "nvidia-cuda-nvcc-cu12==12.1.105",
        "tqdm",
        "matplotlib",
        "psutil",
    ],
    extras_require={
        "dev": ["pytest", "hypothesis", "ruff", "pytorch-lightning>=2.4"],
        "io": ["liburing"],
    },
    entry_points={"console_scripts": ["directload=directload.cli:main"]},
)
