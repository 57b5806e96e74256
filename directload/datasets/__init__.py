"""Datasets: OGB node-property datasets from disk, a synthetic generator in OGB's layout, and real graphs imported
from one ``.npz`` file into that layout."""

from .imported import import_npz
from .ogb_loader import (
    FEATURE_FILE,
    Dataset,
    IncompleteDatasetError,
    SplitIndexError,
    convert,
    dataset_dir,
    load,
    ogb_meta_dict,
)
from .synthetic import PRESETS, SynthConfig, check_name, dataset_exists, synthesize

__all__ = ["Dataset", "load", "convert", "ogb_meta_dict", "synthesize", "SynthConfig", "PRESETS", "check_name",
           "IncompleteDatasetError", "SplitIndexError", "dataset_exists", "dataset_dir", "FEATURE_FILE",
           "import_npz"]
