"""DeepSpeed: ZeRO stages 0-3 with offload, and the pipeline engine."""
