"""The default config tree: every key of the schema with its default value.

One piece over 400 lines: the schema is one tree built key by key; split by section, `_C` would be spread over modules.

Key names follow fast-reid so that its users' YAML files load unchanged. Keys marked
"(ours)" are additions. Units: keys in epochs are converted to iterations by the
trainer; the engine itself counts iterations.
"""
from .config import CfgNode as CN
from .on_off_keys import ON_OFF_KEYS  # noqa: F401  (re-exported: its old home)

_C = CN()

# ---------------------------------------------------------------------------- #
# Model
# ---------------------------------------------------------------------------- #
_C.MODEL = CN()
# (ours) "auto" = cuda if available, else cpu. "cuda" without CUDA is a clear error.
_C.MODEL.DEVICE = "auto"
_C.MODEL.META_ARCHITECTURE = "Baseline"
# Module-name prefixes kept frozen for SOLVER.FREEZE_ITERS iterations.
_C.MODEL.FREEZE_LAYERS = []
# (ours) channels_last memory format for the CNN: auto = on for CUDA devices, off on CPU; or on / off.
_C.MODEL.CHANNELS_LAST = "auto"
# (ours) torch.compile mode, the model compiled in place (checkpoint keys unchanged): off, default,
# reduce-overhead (CUDA graphs), max-autotune, max-autotune-no-cudagraphs, or auto (reduce-overhead
# for CUDA training unless the architecture is eager-only; eager on the CPU). True / False (older
# files) mean default / off. See reid_engine/runtime/compile.py.
_C.MODEL.COMPILE = "auto"
# (ours) torch.compile backend: inductor, or a cheaper one for debugging (aot_eager, eager).
_C.MODEL.COMPILE_BACKEND = "inductor"
# (ours) what torch.compile compiles: model (one graph), blocks (each repeated block: ResNet
# bottlenecks, ViT blocks ...; the glue runs eager), or auto (model; blocks for a run that freezes
# layers first, whose release then recompiles only the blocks that contain them).
_C.MODEL.COMPILE_SCOPE = "auto"
# (ours) under MODEL.COMPILE auto, compile only when the expected saving over the iterations left
# exceeds the expected compile time (a short run or a fine-tune stays eager); False: compile whenever
# auto may (its fallbacks still apply). See reid_engine/runtime/compile_cost.py.
_C.MODEL.COMPILE_WEIGH_COST = True
# Checkpoint to load (eval-only, fine-tuning). Ignored when --resume finds a checkpoint.
_C.MODEL.WEIGHTS = ""
# Images enter the model as 0..255 and are normalised inside it.
_C.MODEL.PIXEL_MEAN = [123.675, 116.28, 103.53]
_C.MODEL.PIXEL_STD = [58.395, 57.12, 57.375]
# MoCo meta architecture: features (and labels) kept in its memory queue; a multiple of
# SOLVER.IMS_PER_BATCH (the global batch), since every step enqueues one global batch.
_C.MODEL.QUEUE_SIZE = 8192

_C.MODEL.BACKBONE = CN()
_C.MODEL.BACKBONE.NAME = "build_resnet_backbone"
_C.MODEL.BACKBONE.DEPTH = "50x"  # 18x 34x 50x 101x 152x
_C.MODEL.BACKBONE.LAST_STRIDE = 1
_C.MODEL.BACKBONE.NORM = "BN"  # BN, syncBN, GN, FrozenBN
_C.MODEL.BACKBONE.WITH_IBN = False
_C.MODEL.BACKBONE.WITH_SE = False
_C.MODEL.BACKBONE.WITH_NL = False
# ResNet only: channels of every stage x WIDTH_MULT (0.5 = half width, about a quarter of the
# FLOPs). Not a fast-reid key; 1.0 is the published ResNet that fast-reid checkpoints fit.
_C.MODEL.BACKBONE.WIDTH_MULT = 1.0
_C.MODEL.BACKBONE.PRETRAIN = False
# Local file with torchvision-format ImageNet weights, or IBN-Net weights.
_C.MODEL.BACKBONE.PRETRAIN_PATH = ""
# Vision transformer (build_vit_backbone; TransReID's options).
_C.MODEL.BACKBONE.STRIDE_SIZE = (16, 16)  # patch stride; 16 = non-overlapping 16x16 patches, 12 = TransReID
_C.MODEL.BACKBONE.DROP_RATIO = 0.0  # dropout after positions / in attention output and MLP
_C.MODEL.BACKBONE.ATT_DROP_RATE = 0.0  # dropout on attention weights
_C.MODEL.BACKBONE.DROP_PATH_RATIO = 0.1  # stochastic depth of the last block (linear from 0)
# Side information embedding: a learned camera embedding times SIE_COE added to the tokens,
# built when SIE_COE > 0 and NUM_CAMERAS > 1. NUM_CAMERAS 0 = none (fast-reid's ViT never
# builds one); -1 = the training set's camera count, filled in by the trainer.
_C.MODEL.BACKBONE.SIE_COE = 3.0
_C.MODEL.BACKBONE.NUM_CAMERAS = 0

# (ours) TransReID's jigsaw patch module (MODEL.META_ARCHITECTURE TransReID, a ViT backbone):
# NUM_PARTS local features, each from a group of the patch tokens (after a shift by
# SHIFT_NUM - 1 and a shuffle over SHUFFLE_GROUPS interleaved runs when REARRANGE) behind the
# class token through a copy of the ViT's last block. TransReID's values.
_C.MODEL.JPM = CN()
_C.MODEL.JPM.NUM_PARTS = 4
_C.MODEL.JPM.SHIFT_NUM = 5
_C.MODEL.JPM.SHUFFLE_GROUPS = 2
_C.MODEL.JPM.REARRANGE = True

_C.MODEL.HEADS = CN()
_C.MODEL.HEADS.NAME = "EmbeddingHead"
_C.MODEL.HEADS.NORM = "BN"
# 0 = filled in from the training set by the trainer.
_C.MODEL.HEADS.NUM_CLASSES = 0
# 0 = no extra 1x1 embedding layer.
_C.MODEL.HEADS.EMBEDDING_DIM = 0
_C.MODEL.HEADS.WITH_BNNECK = False
# "before" or "after" the BN neck: the feature the metric (triplet-type) losses get in
# training. The test feature is TEST.NECK_FEAT (fast-reid tests with the neck output).
_C.MODEL.HEADS.NECK_FEAT = "before"
# Identity Flatten GlobalAvgPool GlobalMaxPool GeneralizedMeanPooling
# GeneralizedMeanPoolingP AdaptiveAvgMaxPool ClipGlobalAvgPool
_C.MODEL.HEADS.POOL_LAYER = "GlobalAvgPool"
# Linear ArcSoftmax CosSoftmax CircleSoftmax
_C.MODEL.HEADS.CLS_LAYER = "Linear"
_C.MODEL.HEADS.MARGIN = 0.0
_C.MODEL.HEADS.SCALE = 1
# (ours, video ReID) How MODEL.META_ARCHITECTURE VideoBaseline pools the T frame maps of a
# tracklet into one map before the head: avg, max, or attention (learned per-frame weights).
_C.MODEL.HEADS.TEMPORAL_POOL = "avg"

_C.MODEL.LOSSES = CN()
# Any of CrossEntropyLoss TripletLoss CircleLoss Cosface FocalLoss.
_C.MODEL.LOSSES.NAME = ("CrossEntropyLoss",)

_C.MODEL.LOSSES.CE = CN()
_C.MODEL.LOSSES.CE.EPSILON = 0.0  # label smoothing; -1 = adaptive
_C.MODEL.LOSSES.CE.ALPHA = 0.2
_C.MODEL.LOSSES.CE.SCALE = 1.0

_C.MODEL.LOSSES.FL = CN()
_C.MODEL.LOSSES.FL.ALPHA = 0.25
_C.MODEL.LOSSES.FL.GAMMA = 2
_C.MODEL.LOSSES.FL.SCALE = 1.0

_C.MODEL.LOSSES.TRI = CN()
_C.MODEL.LOSSES.TRI.MARGIN = 0.3  # 0 = soft margin
_C.MODEL.LOSSES.TRI.NORM_FEAT = False
_C.MODEL.LOSSES.TRI.HARD_MINING = False
_C.MODEL.LOSSES.TRI.SCALE = 1.0

_C.MODEL.LOSSES.CIRCLE = CN()
_C.MODEL.LOSSES.CIRCLE.MARGIN = 0.25
_C.MODEL.LOSSES.CIRCLE.GAMMA = 128
_C.MODEL.LOSSES.CIRCLE.SCALE = 1.0

_C.MODEL.LOSSES.COSFACE = CN()
_C.MODEL.LOSSES.COSFACE.MARGIN = 0.25
_C.MODEL.LOSSES.COSFACE.GAMMA = 128
_C.MODEL.LOSSES.COSFACE.SCALE = 1.0

# ---------------------------------------------------------------------------- #
# Input
# ---------------------------------------------------------------------------- #
_C.INPUT = CN()
_C.INPUT.SIZE_TRAIN = [256, 128]  # [height, width]
_C.INPUT.SIZE_TEST = [256, 128]
# (ours, torchreid's seq_len and sample_method; video datasets only) Frames taken from each
# tracklet, and how training picks them: evenly (every (n // SEQ_LEN)-th frame) or random
# (sorted random frames). The test sets use TEST.SAMPLE_METHOD. torchreid's default is 15.
_C.INPUT.SEQ_LEN = 15
_C.INPUT.SAMPLE_METHOD = "evenly"

_C.INPUT.CROP = CN()
_C.INPUT.CROP.ENABLED = False
_C.INPUT.CROP.SIZE = [224, 224]
_C.INPUT.CROP.SCALE = [0.16, 1]
_C.INPUT.CROP.RATIO = [3.0 / 4.0, 4.0 / 3.0]

_C.INPUT.FLIP = CN()
_C.INPUT.FLIP.ENABLED = False
_C.INPUT.FLIP.PROB = 0.5

_C.INPUT.PADDING = CN()
_C.INPUT.PADDING.ENABLED = False
_C.INPUT.PADDING.MODE = "constant"
_C.INPUT.PADDING.SIZE = 10

_C.INPUT.CJ = CN()
_C.INPUT.CJ.ENABLED = False
_C.INPUT.CJ.PROB = 0.5
_C.INPUT.CJ.BRIGHTNESS = 0.15
_C.INPUT.CJ.CONTRAST = 0.15
_C.INPUT.CJ.SATURATION = 0.1
_C.INPUT.CJ.HUE = 0.1

_C.INPUT.AFFINE = CN()
_C.INPUT.AFFINE.ENABLED = False

_C.INPUT.AUTOAUG = CN()
_C.INPUT.AUTOAUG.ENABLED = False
_C.INPUT.AUTOAUG.PROB = 0.0

_C.INPUT.AUGMIX = CN()
_C.INPUT.AUGMIX.ENABLED = False
_C.INPUT.AUGMIX.PROB = 0.0

_C.INPUT.REA = CN()  # random erasing
_C.INPUT.REA.ENABLED = False
_C.INPUT.REA.PROB = 0.5
_C.INPUT.REA.VALUE = [123.675, 116.28, 103.53]
# fast-reid's (torchvision's) ranges: erased area as a fraction of the image, and the
# aspect ratio (h / w), drawn log-uniformly.
_C.INPUT.REA.SCALE = [0.02, 0.33]
_C.INPUT.REA.RATIO = [0.3, 3.3]

_C.INPUT.RPT = CN()  # random patch
_C.INPUT.RPT.ENABLED = False
_C.INPUT.RPT.PROB = 0.5

# (ours) Where PADDING (pad + random crop), FLIP and REA (random erasing) run in training: "off"
# per image in the loader workers (fast-reid's way); "on" batched on the training device just
# before the forward pass, each image drawn independently from the same distributions (the
# workers then only decode, resize and apply the other ops); "auto" is on for CUDA training and
# off on the CPU (no faster there, and the main job's data stream stays as it was: docs/benchmarks.md,
# "Training speed"). Moving them puts them after
# CJ / AFFINE / AUGMIX / RPT instead of before, so "auto" stays off when one of those is enabled.
_C.INPUT.DEVICE_AUGMENT = "auto"

# ---------------------------------------------------------------------------- #
# Datasets
# ---------------------------------------------------------------------------- #
_C.DATASETS = CN()
# (ours) "" = $REID_DATASETS, else ./datasets
_C.DATASETS.ROOT = ""
# Training sets; several are merged with ids kept apart by a dataset prefix.
_C.DATASETS.NAMES = ("Market1501",)
# Test sets; each is evaluated and reported separately.
_C.DATASETS.TESTS = ("Market1501",)
# Fold query + gallery into training.
_C.DATASETS.COMBINEALL = False
# (ours; torchreid's split_id) Which random train / test split of the small benchmarks
# (viper and cuhk01: 0..19, ilids and prid: 0..9) is used. The splits are drawn once and
# kept in <dataset folder>/splits_reid_engine.json; other datasets ignore this key.
_C.DATASETS.SPLIT_ID = 0

# ---------------------------------------------------------------------------- #
# Data loader
# ---------------------------------------------------------------------------- #
_C.DATALOADER = CN()
# TrainingSampler NaiveIdentitySampler BalancedIdentitySampler
# SetReWeightSampler ImbalancedDatasetSampler DomainBalancedSampler (ours)
_C.DATALOADER.SAMPLER_TRAIN = "TrainingSampler"
_C.DATALOADER.NUM_INSTANCE = 4  # K images per identity in a P x K batch
_C.DATALOADER.NUM_WORKERS = 8
_C.DATALOADER.SET_WEIGHT = []
# (ours) A training image that cannot be read (missing, truncated, not an image): "error" stops
# the run with one line naming the file, its training set and its index; "skip" replaces it by
# another image of the same identity (P x K batches keep their shape) and logs the count and the
# first paths. Evaluation always needs every image.
_C.DATALOADER.ON_BAD_IMAGE = "error"
# (ours) Keep every training image decoded and resized in memory, so that the loader workers only
# apply the random ops: "auto" caches when the training pipeline starts with a resize to
# INPUT.SIZE_TRAIN and the caches of this machine's processes fit in a quarter of its available
# memory (Market-1501 at 256x128: 1.3 GB); "on" always caches; "off" decodes every sample.
# Samples are the same bytes either way. YAML true / false mean on / off.
_C.DATALOADER.CACHE_IMAGES = "auto"
# (ours) Seconds the training loop waits for a batch before it ends the run with one line naming
# the stuck loader worker, the index and path it is reading and the file with the stacks of its
# threads (a stalled network file system, a deadlocked decoder). 0 = automatic: 10 x the slowest
# batch a worker took so far, at least 60 s. The same limit bounds every other read of the run:
# one image read by the image cache's fill, and a batch (with workers) or one image read (without)
# of the evaluation and feature-extraction loaders (label-free hook, reid-extract).
_C.DATALOADER.HANG_TIMEOUT = 0.0

# ---------------------------------------------------------------------------- #
# Solver
# ---------------------------------------------------------------------------- #
_C.SOLVER = CN()
_C.SOLVER.AMP = CN()
_C.SOLVER.AMP.ENABLED = False
# (ours) autocast dtype: auto = bfloat16 where the device computes it natively (CUDA compute
# capability >= 8, CPUs with AVX512-BF16 / AMX), float16 (with gradient scaling) on older GPUs,
# no autocast on other CPUs (emulated bfloat16 is many times slower); or bfloat16 / float16.
_C.SOLVER.AMP.DTYPE = "auto"

_C.SOLVER.OPT = "Adam"  # any torch.optim name
_C.SOLVER.MAX_EPOCH = 120
_C.SOLVER.BASE_LR = 3e-4
_C.SOLVER.HEADS_LR_FACTOR = 1.0
_C.SOLVER.MOMENTUM = 0.9
_C.SOLVER.NESTEROV = False
_C.SOLVER.WEIGHT_DECAY = 0.0005
_C.SOLVER.WEIGHT_DECAY_NORM = 0.0005
_C.SOLVER.BIAS_LR_FACTOR = 1.0
_C.SOLVER.WEIGHT_DECAY_BIAS = 0.0005
# Layer-wise LR decay for backbones that number their layers (ViT): a parameter of layer i
# of n gets lr * LAYER_DECAY ** (n - i); the head keeps the full lr. 1.0 = off.
_C.SOLVER.LAYER_DECAY = 1.0

_C.SOLVER.SCHED = "MultiStepLR"  # MultiStepLR CosineAnnealingLR
_C.SOLVER.DELAY_EPOCHS = 0  # cosine starts after this many epochs
_C.SOLVER.GAMMA = 0.1
_C.SOLVER.STEPS = [30, 55]  # epochs
_C.SOLVER.ETA_MIN_LR = 1e-7

_C.SOLVER.WARMUP_FACTOR = 0.1
_C.SOLVER.WARMUP_ITERS = 1000  # iterations
_C.SOLVER.WARMUP_METHOD = "linear"  # linear constant exp

_C.SOLVER.FREEZE_ITERS = 0  # iterations
_C.SOLVER.CHECKPOINT_PERIOD = 20  # epochs
# How many periodic model_XXXXXXX.pth files to keep (the newest; the folder is scanned, so
# it holds across restarts); 0 keeps all. model_final / model_best are never deleted.
_C.SOLVER.CHECKPOINT_MAX_TO_KEEP = 0
# Global batch, split over workers.
_C.SOLVER.IMS_PER_BATCH = 64
# (ours, detectron2 meaning) 0 = no automatic scaling to the worker count.
_C.SOLVER.REFERENCE_WORLD_SIZE = 0

_C.SOLVER.CLIP_GRADIENTS = CN()
_C.SOLVER.CLIP_GRADIENTS.ENABLED = False
_C.SOLVER.CLIP_GRADIENTS.CLIP_TYPE = "norm"  # norm or value
_C.SOLVER.CLIP_GRADIENTS.CLIP_VALUE = 5.0
_C.SOLVER.CLIP_GRADIENTS.NORM_TYPE = 2.0

# ---------------------------------------------------------------------------- #
# Test
# ---------------------------------------------------------------------------- #
_C.TEST = CN()
_C.TEST.EVAL_PERIOD = 20  # epochs
_C.TEST.IMS_PER_BATCH = 64
_C.TEST.METRIC = "cosine"  # cosine euclidean
# Test feature: "after" the BN neck (fast-reid's behaviour; the pooled or embedded feature
# itself without a BN neck) or "before" it (the pooled or embedded feature). The feature
# the metric losses see in training is MODEL.HEADS.NECK_FEAT.
_C.TEST.NECK_FEAT = "after"
# (ours, video datasets only) Frames of a query / gallery tracklet: evenly or random
# (INPUT.SEQ_LEN frames), or all (every frame; one tracklet per batch).
_C.TEST.SAMPLE_METHOD = "evenly"

_C.TEST.ROC = CN()
_C.TEST.ROC.ENABLED = False

_C.TEST.FLIP = CN()  # average features of the image and its mirror
_C.TEST.FLIP.ENABLED = False

_C.TEST.AQE = CN()  # alpha query expansion
_C.TEST.AQE.ENABLED = False
_C.TEST.AQE.ALPHA = 3.0
_C.TEST.AQE.QE_TIME = 1
_C.TEST.AQE.QE_K = 5

_C.TEST.RERANK = CN()  # k-reciprocal re-ranking
_C.TEST.RERANK.ENABLED = False
_C.TEST.RERANK.K1 = 20
_C.TEST.RERANK.K2 = 6
_C.TEST.RERANK.LAMBDA = 0.3

_C.TEST.PRECISE_BN = CN()
_C.TEST.PRECISE_BN.ENABLED = False
_C.TEST.PRECISE_BN.DATASET = "Market1501"
_C.TEST.PRECISE_BN.NUM_ITER = 300

# (ours) After the run's last evaluation, write OUTPUT_DIR/ranks.png: a few queries of the
# first test set with their top-10 gallery images (green border: same identity, red: another),
# ranked by TEST.METRIC on the features that evaluation computed. Needs matplotlib (without it
# the picture is skipped with one log line).
_C.TEST.RANK_VIS = False

# (ours) [[dataset, metric, value, tolerance], ...] checked after training.
_C.TEST.EXPECTED_RESULTS = []

# ---------------------------------------------------------------------------- #
# Knowledge distillation (MODEL.META_ARCHITECTURE Distiller)
# ---------------------------------------------------------------------------- #
_C.KD = CN()
# Teacher config files (each merged onto the defaults) and their checkpoints, one per teacher.
_C.KD.MODEL_CONFIG = []
_C.KD.MODEL_WEIGHTS = []
# Self-distillation: a teacher that is an exponential moving average of the student.
_C.KD.EMA = CN()
_C.KD.EMA.ENABLED = False
_C.KD.EMA.MOMENTUM = 0.999

# ---------------------------------------------------------------------------- #
# (ours) Label-free training: pseudo labels by clustering (docs/label_free.md)
# ---------------------------------------------------------------------------- #
_C.PSEUDO = CN()
# Train on pseudo labels: every PERIOD epochs the target sets' training images are embedded,
# clustered (k-reciprocal Jaccard distance + DBSCAN) and the cluster memory reset from the clusters.
_C.PSEUDO.ENABLED = False
# Training sets of DATASETS.NAMES whose labels are hidden and replaced by clusters; empty = all of
# them (USL / UDA). The other sets of DATASETS.NAMES train with their labels (joint training).
_C.PSEUDO.TARGETS = []
# Epochs between two clusterings (the first is at the start of training).
_C.PSEUDO.PERIOD = 1
# Iterations per epoch; 0 = training images // SOLVER.IMS_PER_BATCH (the supervised rule).
_C.PSEUDO.ITERS_PER_EPOCH = 200
# DBSCAN on the Jaccard distance: neighbourhood radius and core-point neighbours (itself included).
_C.PSEUDO.EPS = 0.6
_C.PSEUDO.MIN_SAMPLES = 4
# k-reciprocal neighbours (k1) and query expansion (k2) of the Jaccard distance.
_C.PSEUDO.K1 = 30
_C.PSEUDO.K2 = 6
# Feature rows per block of the bounded-memory Jaccard computation; 0 = automatic.
_C.PSEUDO.CHUNK_SIZE = 0
# Cluster camera-normalised features: each camera's mean feature is subtracted (then rows renormalised)
# before the Jaccard distance, so that strong camera styles do not make the clusters cameras.
_C.PSEUDO.CAMERA_NORM = False
# Cluster memory (MODEL.META_ARCHITECTURE ClusterContrast): softmax temperature, momentum of the
# per-batch centroid update, and "mean" (all batch features of a cluster) or "hard" (its hardest).
_C.PSEUDO.MEMORY = CN()
_C.PSEUDO.MEMORY.TEMP = 0.05
_C.PSEUDO.MEMORY.MOMENTUM = 0.1
_C.PSEUDO.MEMORY.MODE = "mean"
# Camera-aware proxies (CAP): per-camera sub-cluster proxies with intra- and inter-camera contrast.
_C.PSEUDO.CAMERA_PROXY = CN()
_C.PSEUDO.CAMERA_PROXY.ENABLED = False
_C.PSEUDO.CAMERA_PROXY.TEMP = 0.07
_C.PSEUDO.CAMERA_PROXY.MOMENTUM = 0.2
_C.PSEUDO.CAMERA_PROXY.HARD_NEGATIVES = 50
_C.PSEUDO.CAMERA_PROXY.WEIGHT = 0.5

# ---------------------------------------------------------------------------- #
# (ours) MLflow tracking (optional: pip install 'reid_engine[mlflow]'; docs/tracking.md, "MLflow")
# ---------------------------------------------------------------------------- #
_C.MLFLOW = CN()
# Log the config (params), the metrics (step = iteration), the run's files and its end status to
# MLflow, on the main process, beside metrics.json and tensorboard.
_C.MLFLOW.ENABLED = False
# Tracking store; "" = the MLFLOW_TRACKING_URI environment variable if set, else the SQLite store
# OUTPUT_DIR/mlruns/mlflow.db (artifacts in OUTPUT_DIR/mlruns/mlartifacts).
_C.MLFLOW.TRACKING_URI = ""
# Experiment of the run (created when missing).
_C.MLFLOW.EXPERIMENT = "reid_engine"
# Run name; "" = the name of OUTPUT_DIR's folder.
_C.MLFLOW.RUN_NAME = ""
# Id of a parent run (reid-tune sets it: a study's trials are nested runs of one parent run).
_C.MLFLOW.PARENT_RUN_ID = ""

# ---------------------------------------------------------------------------- #
# Misc
# ---------------------------------------------------------------------------- #
# (ours) >= 0 makes runs repeatable; each worker gets SEED + rank.
_C.SEED = -1
_C.CUDNN_BENCHMARK = False
_C.OUTPUT_DIR = "output"


# ---------------------------------------------------------------------------- #
# fast-reid compatibility: keys that exist only so that fast-reid config files load.
# No code reads them; a value other than the default logs one warning naming the keys
# and why (config.compat.warn_inert_keys). The change that implements a key moves it up
# into its group and out of INERT_KEYS.
# ---------------------------------------------------------------------------- #
# Channels of the backbone output in fast-reid; here the backbone reports them itself.
_C.MODEL.BACKBONE.FEAT_DIM = 2048

# key -> why it has no effect
INERT_KEYS = {
    "MODEL.BACKBONE.FEAT_DIM": "the head takes its input width from the backbone's out_channels",
}
