"""What the tests share: fixtures' helpers, local servers (a Redis Cluster, ACL and TLS Redis, a TCP
proxy that loses replies), a parent workflow and a taskiq app; no test is collected from here."""
