"""The dloader node sidecar: a gRPC daemon that divides a node's loader resources (workers,
CPU) between the training jobs on it so that their accelerators wait for data as little as
possible. Entry points: ``dloader-sidecar`` (:mod:`dloader.sidecar.cli`) and ``dloaderctl``
(:mod:`dloader.sidecar.ctl`)."""
