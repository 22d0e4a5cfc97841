"""`python -m mlflow_neuron.cli`: the `mlflow-neuron` command."""

import sys

from . import main

sys.exit(main())
