"""Person search: a persistent gallery index of embeddings, built once and queried by image."""
