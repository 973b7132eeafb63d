"""truthserver: the ground-truth streaming server that loadgen's accuracy benchmark scores clients against."""
