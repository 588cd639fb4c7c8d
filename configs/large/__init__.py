"""Large deployments described as data (`specjax.deploy`): one config per target and method."""
