"""Pure-torch learning code: datasets, partitions, models, local training and the papers' fusion math.

Nothing here touches the network or the file system beyond reading datasets and shards.
"""
