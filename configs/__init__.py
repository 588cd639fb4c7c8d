"""Experiment configs (`experiments/run.py --config=configs/NAME.py[:ARG]`) and training configs
(`train/main.py --config=configs/train_KIND.py`), as ml_collections files; importable too, e.g.
`configs.eagle.get_config("eagle3,small")`. `configs/large/` describes large deployments."""
