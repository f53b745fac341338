"""A role played and the models it moves: roles (one at a time), the transport a round runner uses, an aggregator's
collector, the checks on a model's arrival, assignments, absences and what transfers measured of each link."""
