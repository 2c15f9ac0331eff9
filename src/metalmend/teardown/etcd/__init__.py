"""etcd for node teardown: a small v3 client over the JSON gateway, the site's
``promenade/EtcdClusters/v1`` design, and quorum-safe member removal (docs/teardown.md)."""
