"""The paper's Long Range Arena experiments (Table 3): presets, runs and the ``nystrom lra`` command."""
