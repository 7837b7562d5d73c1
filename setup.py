"""Install reid_engine: `pip install -e .` (docs/install.md has the pinned environment and the extras)."""
import os

from setuptools import find_packages, setup


def _version() -> str:
    init = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reid_engine", "__init__.py")
    with open(init, encoding="utf-8") as f:
        for line in f:
            if line.startswith("__version__"):
                return line.split("=")[1].strip().strip('"').strip("'")
    raise RuntimeError("no __version__ in reid_engine/__init__.py")


setup(
    name="reid_engine",
    version=_version(),
    description="Training and evaluation of person and vehicle re-identification models",
    long_description=open("README.md", encoding="utf-8").read() if os.path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    classifiers=[
        "License :: OSI Approved :: Apache Software License",
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
    python_requires=">=3.9",
    packages=find_packages(exclude=("tests", "tests.*", "tools", "configs")),
    install_requires=[
        "torch>=2.1",
        "yacs>=0.1.8",
        "fvcore>=0.1.5",
        "tensorboardX>=2.5",
        "Pygments>=2.10",
        "termcolor>=1.1",
        "numpy>=1.22",
        "Pillow>=9.0",
        "tabulate>=0.8",
        "PyYAML>=5.1",
        "scikit-learn>=1.0",
        "scipy>=1.8",
        "h5py>=3.0",
    ],
    extras_require={
        "test": ["pytest>=7", "pytest-timeout>=2"],
        "vis": ["matplotlib>=3.5"],
        "export": ["onnx>=1.14", "onnxruntime>=1.16"],
        # reid-export --format openvino (converted from the ONNX export) and its NNCF int8
        "openvino": ["onnx>=1.14", "openvino>=2025.0", "nncf>=2.16"],
        # BoxMOT with reid-export --format boxmot, tools/track_synthetic.py: what boxmot's ONNX ReID back end
        # and trackers import, and MOT metrics. boxmot itself: `pip install --no-deps boxmot` (its declared
        # torchvision / timm would replace a CPU torch with a CUDA build; that path imports neither)
        "track": ["opencv-python-headless>=4.7,<5", "lapx>=0.5.5,<1", "rich>=13", "motmetrics>=1.4",
                  "pandas>=2,<3"],
        # Optuna 4.9+: RetryHeartbeatStaleTrialCallback; a finished study's summary and plots need pandas
        # (trials_dataframe) and matplotlib (optuna.visualization.matplotlib); filelock: the SQLite study's lock
        "tune": ["optuna>=4.9", "filelock>=4.3", "sqlalchemy>=2.0", "psycopg[binary]>=3.1", "pandas>=2,<3", "matplotlib>=3.5"],
        # SQLAlchemy and alembic: the default local store is SQLite (MLflow 3.13+ refuses its file store)
        # log_batch(..., synchronous=False) and start_run(parent_run_id=...), as in mlflow-skinny 3.17
        "mlflow": ["mlflow-skinny>=3.0", "SQLAlchemy>=1.4", "alembic>=1.8"],
        # reid-index (person search): faiss embedded; Milvus (a server, or Milvus Lite in-process)
        "search": ["faiss-cpu>=1.8", "pymilvus>=2.4", "milvus-lite>=2.4"],
    },
    entry_points={
        "console_scripts": [
            "reid-train=reid_engine.cli.train:main",
            "reid-extract=reid_engine.cli.extract:main",
            "reid-export=reid_engine.cli.export:main",
            "reid-visualize=reid_engine.cli.visualize:main",
            "reid-make-synthetic=reid_engine.cli.make_synthetic:main",
            "reid-data=reid_engine.cli.data:main",
            "reid-tune=reid_engine.cli.tune:main",
            "reid-index=reid_engine.cli.index:main",
        ]
    },
)
