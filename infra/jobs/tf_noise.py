"""TensorFlow's load-time log: lines every process that imports TensorFlow
may print before its own first word, and that say nothing about it.

The C++ library logs while it loads, before its logging reads
TF_CPP_MIN_LOG_LEVEL (so setting it does not help): absl's notice that
logging is not yet initialised, oneDNN being on (``port.cc``), the CPU
features the binary was not built for (``cpu_feature_guard.cc``, with a
second line), and on machines without CUDA (or with two copies of its
plugins) the CUDA driver not found and the cuDNN/cuFFT/cuBLAS factories
registered twice, and TensorRT missing. ``exec -- python -c "import
tensorflow"`` printed 12 such lines around 3 of answer, and ``run`` and
``logs`` showed them once per process.

``is_tf_noise`` is the one filter: the CLI's ``run``, ``exec`` and ``logs``
leave these lines out unless ``--raw``. A line is noise only when both its
source file and the start of its message are known ones, in either of
TensorFlow's two log formats (``2025-03-10 15:55:25.474408: I path/port.cc:153]``
and absl's ``I0000 00:00:1741640125.496393 4606 port.cc:153]``): any other
line of TensorFlow's, a warning or an error, is kept. The lines are tested
as recorded (tests/recorded/tf-load-log-*.txt).
"""

from __future__ import annotations

import re

# Either log prefix, then the source file's base name, then `] `.
_PREFIX = (
    r"(?:\d{4}-\d\d-\d\d [\d:.]+: [IWEF] (?:[\w.-]+/)*"  # 2025-... I tensorflow/core/util/
    r"|[IWEF]\d{4} [\d:.]+ +\d+ )"  # I0000 00:00:1741640125.496393    4606
)
# (source file, what its message starts with)
_KNOWN = (
    ("port.cc", "oneDNN custom operations are on"),
    ("cpu_feature_guard.cc", "This TensorFlow binary is optimized to use available CPU"),
    ("cudart_stub.cc", "Could not find cuda drivers on your machine"),
    ("cuda_dnn.cc", "Unable to register cuDNN factory"),
    ("cuda_fft.cc", "Unable to register cuFFT factory"),
    ("cuda_blas.cc", "Unable to register cuBLAS factory"),
    ("py_utils.cc", "TF-TRT Warning: Could not find TensorRT"),
)
_NOISE = re.compile(
    "|".join(
        [
            *(_PREFIX + re.escape(f) + r":\d+\] " + re.escape(m) for f, m in _KNOWN),
            # absl's notice, once per process.
            re.escape("WARNING: All log messages before absl::InitializeLog() is called"),
            # cpu_feature_guard's second line.
            r"To enable the following instructions: [\w ,.]*, in other operations, "
            r"rebuild TensorFlow with the appropriate compiler flags\.",
        ]
    )
)


def is_tf_noise(line: str) -> bool:
    """Whether ``line`` is one of TensorFlow's load-time log lines."""
    return _NOISE.match(line) is not None
