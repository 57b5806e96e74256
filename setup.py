"""directload: GPU-centric feature loading for mini-batch GNN training."""

from pathlib import Path

from setuptools import setup

# The DGL stack that works: DGL's last PyPI wheels (2.1.0) carry native libraries for torch 2.2.1 only.
DGL_STACK = [
    "torch==2.2.1",
    "dgl==2.1.0",
    # numpy 2 breaks torch 2.2's wheels.
    "numpy>=1.24,<2",
    "ogb==1.3.6",
    "torchdata==0.7.1",
    # DGL imports setuptools.extern at run time.
    "setuptools<70",
    "pyyaml",
    "pydantic",
    # CUDA 12, as torch 2.2.1's wheels; libNVVM matching torch's CUDA 12.1 for numba.cuda.compile_ptx.
    "cupy-cuda12x>=13,<14",
    "nvidia-cuda-nvcc-cu12==12.1.105",
]

setup(
    name="directload",
    version="0.1.0",
    description="Zero-copy, aligned GPU gathers of GNN node features from host memory and SSD",
    long_description=(Path(__file__).parent / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    python_requires=">=3.11,<3.14",
    # kernels/ and loaders/ install as directload.kernels and directload.loaders,
    # so nothing lands under a generic top-level name.
    packages=["directload", "directload.budget", "directload.datasets", "directload.graph", "directload.harness",
              "directload.harness.commands", "directload.stores", "directload.stores.policies", "directload.kernels",
              "directload.loaders", "directload.loaders.dgl", "directload.loaders.pyg"],
    package_dir={
        "directload": "directload",
        "directload.kernels": "kernels",
        "directload.loaders": "loaders",
    },
    package_data={"directload.kernels": ["cuda/*.cu", "cuda/*.h", "cuda/*.cpp"]},
    # The core: the unified tensor, the kernels and the stores; no framework, no pins.
    install_requires=[
        "torch>=2.2,<2.16",
        "numpy>=1.24,<3",
        "numba>=0.60",
        "numba-cuda>=0.20",
        "tqdm",
        "matplotlib",
        "psutil",
        "crc32c>=2.3",
    ],
    extras_require={
        # DGL's loader and the DGL training harness (the only torch DGL runs on).
        "dgl": DGL_STACK,
        # PyG's NeighborLoader and FeatureStore; without pyg-lib or torch-sparse, directload's sampler runs,
        # so nothing compiles.
        "pyg": ["torch-geometric>=2.8,<2.9", "ogb==1.3.6"],
        # PyG's own CPU sampler (torch-sparse), to train on PyG's own batches or compare with them; published
        # as source only and built against the installed torch (scripts/dev.sh test does it, about 8 minutes).
        "pyg-sampler": ["torch-scatter>=2.1.2", "torch-sparse>=0.6.18"],
        # CuPy and the compilers, by the CUDA major version of the installed torch (chosen at run time).
        "cuda12": ["cupy-cuda12x>=13", "nvidia-cuda-nvcc-cu12>=12.1,<13"],
        "cuda13": ["cupy-cuda13x>=14,<15", "nvidia-nvvm>=13,<14", "nvidia-cuda-nvrtc>=13,<14"],
        # OGB's raw-file readers, to load datasets (real or generated); the framework extras include it.
        "ogb": ["ogb==1.3.6"],
        "io": ["liburing"],
        "dev": ["pytest", "hypothesis", "ruff", "import-linter>=2.1", "pytorch-lightning>=2.4", "mypy>=1.10"],
        # The documentation site (mkdocs.yml): installed alone into .venv-docs, since mkdocstrings reads the
        # code without importing it; ruff formats the signatures.
        "docs": ["mkdocs>=1.6", "mkdocs-material>=9.5", "mkdocstrings>=1.0", "mkdocstrings-python>=2.0", "ruff"],
    },
    entry_points={"console_scripts": ["directload=directload.harness.cli:main"]},
)
