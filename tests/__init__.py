"""The tests convert onto the chunked path (the reference) unless they name a kernel or ask for the user's
default (the ``user_kernel`` fixture); the kernel tests (test_kernel_fused, test_band, test_dense) check the
others. Set here, on import of the package, so that a child process spawned with a test's function (a
pipeline run killed midway, a fine-tune in a second process) converts as its parent does."""

from retrofit import core

CONVERT_DEFAULTS = core.convert.__kwdefaults__
CONVERT_DEFAULTS["kernel"] = "chunked"
