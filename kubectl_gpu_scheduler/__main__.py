"""`python -m kubectl_gpu_scheduler`: the same command as the `kubectl-gpu_scheduler` script."""
import sys

from .cli import main

sys.exit(main())
