"""specjax: speculative decoding for JAX."""

from setuptools import find_packages, setup

# The JAX stack was verified at these versions (CPU, Python 3.11).
INSTALL_REQUIRES = [
  "jax[cpu]==0.10.2",
  "flax==0.12.8",  # specjax.nnx_target: Flax NNX modules as targets
  "optax==0.2.8",
  "orbax-checkpoint==0.12.8",
  "numpy>=2.0",
  "absl-py>=2.1",
  "ml-collections==1.1.0",
  "tokenizers==0.23.3",
  "safetensors==0.8.0",
  "gguf==0.19.0",
  "jinja2>=3.1",
]

PLOTS = ["matplotlib==3.11.2", "tensorboardX==2.6.5"]  # experiment plots and TensorBoard scalars
NOTEBOOKS = ["nbclient==0.11.0", "nbformat==5.11.1", "ipykernel==7.4.0"]  # executed by the tests

EXTRAS_REQUIRE = {
  "plots": PLOTS,
  # Reference implementation for parity tests and peer benchmarks. torch 2.13.0 is the CPU wheel.
  "reference": ["torch==2.13.0", "transformers==5.24.0", "accelerate==1.15.0"],
  "test": [
    "pytest>=8",
    "pytest-xdist==3.8.0",  # CI runs the suite on 2 workers (the tests are mostly compilation)
    "ruff>=0.6",
    "scipy>=1.11",
    "torch==2.13.0",
    "transformers==5.24.0",
    "accelerate==1.15.0",  # transformers needs it to load GGUF files
    *PLOTS,
    *NOTEBOOKS,
  ],
}

setup(
  name="specjax",
  version="0.1.0",
  description="Speculative decoding for large language models in JAX.",
  packages=find_packages(
    include=["specjax", "specjax.*", "train", "train.*", "configs", "configs.*"]
  ),
  package_data={
    "specjax": [
      "kernels/*.cc",
      "kernels/*.h",
      "drafters/shipped/*.json",
      "drafters/shipped/*.safetensors",
    ]
  },
  python_requires=">=3.10",
  install_requires=INSTALL_REQUIRES,
  extras_require=EXTRAS_REQUIRE,
)
