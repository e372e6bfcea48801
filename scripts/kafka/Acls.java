// Adds or removes a table of ACLs in one admin connection: `scripts/kafka.sh acls add|remove FILE`
// runs it with Java's single-file launcher (no build step), where Kafka's AclCommand would start a
// JVM per resource and take a minute for one pipeline's table.
//
// Usage: java -cp 'libs/*' Acls.java CLIENT_PROPERTIES add|remove FILE   (FILE "-" reads stdin)
// Each line of FILE: PRINCIPAL RESOURCE_TYPE PATTERN_TYPE NAME OPERATION, as `lacuna acls` prints
// them (User:leaf TOPIC LITERAL lacuna.facts WRITE); blank lines and lines from '#' are skipped.
// Every line is an ALLOW for any host.

import java.io.BufferedReader;
import java.io.FileInputStream;
import java.io.FileReader;
import java.io.InputStreamReader;
import java.io.Reader;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.common.acl.AccessControlEntry;
import org.apache.kafka.common.acl.AclBinding;
import org.apache.kafka.common.acl.AclBindingFilter;
import org.apache.kafka.common.acl.AclOperation;
import org.apache.kafka.common.acl.AclPermissionType;
import org.apache.kafka.common.resource.PatternType;
import org.apache.kafka.common.resource.ResourcePattern;
import org.apache.kafka.common.resource.ResourceType;

public class Acls {
    public static void main(String[] args) throws Exception {
        if (args.length != 3 || !(args[1].equals("add") || args[1].equals("remove"))) {
            System.err.println("usage: Acls.java CLIENT_PROPERTIES add|remove FILE");
            System.exit(2);
        }
        Properties properties = new Properties();
        try (FileInputStream in = new FileInputStream(args[0])) {
            properties.load(in);
        }
        List<AclBinding> bindings = read(args[2]);
        try (Admin admin = Admin.create(properties)) {
            if (args[1].equals("add")) {
                admin.createAcls(bindings).all().get();
            } else {
                List<AclBindingFilter> filters = new ArrayList<>();
                for (AclBinding binding : bindings) {
                    filters.add(binding.toFilter());
                }
                admin.deleteAcls(filters).all().get();
            }
        }
        System.err.println("acls: " + (args[1].equals("add") ? "added " : "removed ") + bindings.size());
    }

    static List<AclBinding> read(String file) throws Exception {
        List<AclBinding> bindings = new ArrayList<>();
        Reader source = file.equals("-") ? new InputStreamReader(System.in) : new FileReader(file);
        try (BufferedReader reader = new BufferedReader(source)) {
            String line;
            int number = 0;
            while ((line = reader.readLine()) != null) {
                number++;
                line = line.strip();
                if (line.isEmpty() || line.startsWith("#")) {
                    continue;
                }
                String[] fields = line.split("\\s+");
                if (fields.length != 5) {
                    throw new IllegalArgumentException("line " + number + ": five fields expected: " + line);
                }
                ResourcePattern resource = new ResourcePattern(
                    ResourceType.valueOf(fields[1]), fields[3], PatternType.valueOf(fields[2]));
                AccessControlEntry entry = new AccessControlEntry(
                    fields[0], "*", AclOperation.valueOf(fields[4]), AclPermissionType.ALLOW);
                bindings.add(new AclBinding(resource, entry));
            }
        }
        return bindings;
    }
}
