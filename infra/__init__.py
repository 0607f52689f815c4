"""Run infrastructure beside the training loop: the command line, configuration, run folders
and checkpoints, metrics, and the multi-process helper. A reader of the method can skip it."""
import logging
import warnings

# Two third-party notices that tell a user of this project nothing, filtered by their exact text
# here, before any module of the project imports peft (which imports bitsandbytes):
# bitsandbytes logs that an optional CPU kernel package (`kernels`) is missing; its CPU path works
# without it. transformers warns that peft reads a deprecated attribute (is_gradient_checkpointing).
logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(
    lambda record: "Failed to load CPU gemm_4bit_forward" not in record.getMessage())
warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
